//! Work spread over the machine's cores: compile-time stages whose items are independent
//! (weights to convert, kernels to compile), and large host copies (outputs out of
//! page-locked memory).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads converting weights (the file's bytes to tensors, f32 to f16): the work is
/// memory-bound, so a few threads reach the copy bandwidth, and each holds a weight in flight
/// in both forms — on 16 cores, 16 of them raised a ResNet-50 compile's peak by a sixth.
pub(crate) const CONVERSIONS: usize = 4;

/// NVRTC compiles side by side: each holds its own compiler state (~8 MB), beside the
/// model's weights, at the end of a compile — where a cold compile of a CNN peaks.
pub(crate) const COMPILERS: usize = 4;

/// `f` of every item, in the items' order, computed on up to as many threads as the machine
/// has cores (each thread takes the next item not yet taken).
pub(crate) fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    map_on(usize::MAX, items, f)
}

/// [`map`] on at most `most` threads.
pub(crate) fn map_on<T: Sync, R: Send>(most: usize, items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads =
        std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len()).min(most.max(1));
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(index) else { break };
                        done.push((index, f(item)));
                    }
                    done
                })
            })
            .collect();
        // A panic in `f` is a bug: it goes on in the caller's thread.
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// [`map`] over items it owns: each is handed to `f` by value, so `f` can let it go as soon
/// as it is done with it (what stays in memory is the results and the items not yet taken).
pub(crate) fn map_owned<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    map_owned_on(usize::MAX, items, f)
}

/// [`map_owned`] on at most `most` threads.
pub(crate) fn map_owned_on<T: Send, R: Send>(
    most: usize,
    items: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let slots: Vec<std::sync::Mutex<Option<T>>> =
        items.into_iter().map(|t| std::sync::Mutex::new(Some(t))).collect();
    // Each slot is taken exactly once, so every result is there.
    map_on(most, &slots, |slot| slot.lock().ok().and_then(|mut item| item.take()).map(&f))
        .into_iter()
        .flatten()
        .collect()
}

/// Host copies of at least this many bytes are split over threads: one core copies out of
/// page-locked memory at ~10 GB/s (BERT-base's 3.1 MB output in ~0.32 ms on the H100
/// machine); a few together go faster, and below this size starting them costs more than
/// they save.
const SPLIT_COPIES_FROM: usize = 1 << 20;

/// Threads a large host copy is split over (the calling one included).
const COPIERS: usize = 4;

/// `count` elements made from `bytes` by `fill`, which writes every element of the slots it
/// is given from their bytes (`size` bytes an element): split over up to [`COPIERS`] threads
/// where `bytes` is large.
fn split_fill<T: Send>(
    bytes: &[u8],
    size: usize,
    fill: impl Fn(&mut [std::mem::MaybeUninit<T>], &[u8]) + Sync,
) -> Vec<T> {
    let count = bytes.len() / size.max(1);
    let threads = if bytes.len() >= SPLIT_COPIES_FROM {
        std::thread::available_parallelism().map_or(1, |n| n.get()).min(COPIERS)
    } else {
        1
    };
    let per = count.div_ceil(threads).max(1);
    let mut out: Vec<T> = Vec::with_capacity(count);
    let mut parts = out.spare_capacity_mut()[..count].chunks_mut(per).zip(bytes.chunks(per * size.max(1)));
    let first = parts.next();
    std::thread::scope(|scope| {
        for (slots, from) in parts {
            scope.spawn(|| fill(slots, from));
        }
        if let Some((slots, from)) = first {
            fill(slots, from);
        }
    });
    // SAFETY: the parts cover the first `count` slots, and `fill` wrote every slot of each
    // (a panic in it would have gone on in this thread before this line).
    unsafe { out.set_len(count) };
    out
}

/// A copy of `bytes` (split over threads where they are many).
pub fn copy_bytes(bytes: &[u8]) -> Vec<u8> {
    split_fill(bytes, 1, |slots, from| {
        // SAFETY: `slots` and `from` have the same length (the same split of one count), and
        // the copy's destination is memory of the new vector, apart from `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), slots.as_mut_ptr().cast::<u8>(), from.len()) }
    })
}

/// `get` of each `size`-byte element of `bytes`, in order (split over threads where they are
/// many); bytes past the last whole element are left out.
pub(crate) fn decode<T: Send>(bytes: &[u8], size: usize, get: impl Fn(&[u8]) -> T + Sync) -> Vec<T> {
    split_fill(&bytes[..bytes.len() - bytes.len() % size.max(1)], size, |slots, from| {
        for (slot, element) in slots.iter_mut().zip(from.chunks_exact(size)) {
            slot.write(get(element));
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_keep_the_items_order() {
        let items: Vec<u64> = (0..1000).collect();
        let squares = super::map(&items, |&i| i * i);
        assert_eq!(squares, items.iter().map(|i| i * i).collect::<Vec<_>>());
        assert!(super::map(&[] as &[u64], |&i| i).is_empty());
        let owned = super::map_owned(items.iter().map(|&i| vec![i]).collect(), |v| v[0] + 1);
        assert_eq!(owned, items.iter().map(|i| i + 1).collect::<Vec<_>>());
        assert_eq!(super::map_on(3, &items, |&i| i + 2), items.iter().map(|i| i + 2).collect::<Vec<_>>());
        assert_eq!(super::map_on(0, &items[..5], |&i| i), items[..5].to_vec());
    }

    #[test]
    fn split_copies_and_decodes_keep_every_byte_in_place() {
        // Sizes below and above the split, and counts that do not divide among the threads.
        for len in [0, 1, 7, 1000, super::SPLIT_COPIES_FROM - 3, super::SPLIT_COPIES_FROM + 4 * 1021 + 3] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
            assert_eq!(super::copy_bytes(&bytes), bytes, "{len} bytes");
            let words = super::decode(&bytes, 4, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            let want: Vec<u32> =
                bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            assert_eq!(words, want, "{len} bytes as words");
        }
    }
}
