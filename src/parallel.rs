//! Work spread over the machine's cores: compile-time stages whose items are independent
//! (weights to convert, kernels to compile).

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
}
