//! Tokens fed back on the device: the largest logit of each row (or a token drawn from it) chosen
//! by a kernel that writes the ids straight into the token input the next run reads, and the
//! ids copied to the host without waiting. A decoding loop can then queue the next step before
//! it knows this step's tokens, reading them one step later: the GPU is never idle while the
//! host reads ids back and writes the next step's inputs.

use cudarc::driver::{CudaEvent, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg};

use super::columns::{CacheCopy, ResolvedCopy};
use super::sample::SampleTo;
use super::state::RowCopyLaunch;
use super::{driver, RowDraw, RuntimeError, SampledRows, Session};
use crate::plan::Location;

/// Copies of fed ids still to be taken: at most this many (the loop reads one step late).
const IN_FLIGHT: usize = 2;

/// Threads a block of the argmax kernel.
const ARGMAX_THREADS: usize = 256;

/// The most logits a thread of the argmax kernel takes (its `ARGMAX_ITEMS`).
const ARGMAX_ITEMS_MAX: usize = 16;

/// Logits a thread of the argmax kernel takes for `rows` rows, its loads all issued before it
/// compares them (at most `ARGMAX_ITEMS` in `kernels/argmax_rows.cu`): 16 from 8 rows (a block
/// a chunk of 4,096 of a row, 13 blocks a row of GPT-2's 50,257: at 32 rows the choice's
/// launch 19 → 15 µs on an H200's clock, batch 8 −4 µs a token), 4 below (at one row a token
/// took 1 µs longer with 16 and the copy's wide words together; `benches/NOTES.md`,
/// thirty-ninth session). `FUSEC_ARGMAX_ITEMS` (1 to 16) overrides it, for measuring it.
fn argmax_items(rows: usize) -> usize {
    let default = if rows >= 8 { ARGMAX_ITEMS_MAX } else { 4 };
    crate::knobs::number("FUSEC_ARGMAX_ITEMS")
        .filter(|n| (1..=ARGMAX_ITEMS_MAX).contains(n))
        .unwrap_or(default)
}

/// The page-locked buffers the ids are copied into (or, greedy, written into by the kernel:
/// the buffers are mapped for the device), one per copy in flight, each with its device
/// address and the event recorded after its copy (the session's context tracks no events of
/// its own), and which of them hold ids not yet taken (oldest first).
#[derive(Default)]
pub(super) struct Feed {
    host: Vec<(PinnedHostSlice<u8>, u64, CudaEvent)>,
    /// (buffer, rows) of each copy not yet taken.
    pending: std::collections::VecDeque<(usize, usize)>,
    /// Copies issued so far (the next one's buffer is this modulo [`IN_FLIGHT`]).
    issued: usize,
}

/// A step's cache copy beside its choice ([`Session::copy_beside`]).
enum Beside {
    /// As blocks of the choice's launch.
    Launch(RowCopyLaunch),
    /// Run after it, on its own.
    Apart(ResolvedCopy),
}

impl Session {
    /// Chooses the largest value of each of `rows` rows of `width` of f32 output `logits` of
    /// the last run (the first of equals, as [`Session::argmax_rows`]) on the device, writes
    /// the ids into i64 input `tokens` (`[rows, 1]`) for the next run, and starts copying them
    /// to the host: [`Session::fed_tokens`] returns them. Nothing waits; at most two such
    /// copies may be pending.
    pub fn argmax_feed(
        &mut self,
        logits: &str,
        rows: usize,
        width: usize,
        tokens: &str,
    ) -> Result<(), RuntimeError> {
        let (_, target) = self.fed_input(tokens, rows)?;
        let (slot, host) = self.feed_buffer(rows)?;
        self.launch_argmax(logits, rows, width, (target, Some(host)))?;
        self.fed_back(slot, None, rows)
    }

    /// [`Session::argmax_feed`] for a token drawn from each of rows `at` of `logits`, as
    /// [`Session::sample_rows`] draws it (`draws[i]` the `i`-th row's draw).
    pub fn sample_feed(
        &mut self,
        logits: &str,
        at: SampledRows,
        draw: RowDraw,
        temperature: f64,
        draws: &[f64],
        tokens: &str,
    ) -> Result<(), RuntimeError> {
        let (_, target) = self.fed_input(tokens, at.rows)?;
        self.draw_fed(logits, at, (draw, temperature), draws, (target, None))
    }

    /// [`Session::sample_feed`] and then `cache`'s copy and column sets
    /// ([`Session::copy_output_rows_setting`]) in one launch: the sampling kernel's blocks
    /// past the rows' run the copy. Where that copy is not one launch's (its rows not whole
    /// words, more than two sets), the two run apart.
    pub fn sample_feed_copying(
        &mut self,
        logits: &str,
        at: SampledRows,
        (draw, temperature): (RowDraw, f64),
        draws: &[f64],
        tokens: &str,
        cache: CacheCopy<'_>,
    ) -> Result<(), RuntimeError> {
        let (target, copying) = match self.copy_beside(tokens, at.rows, cache)? {
            (target, Beside::Launch(copying)) => (target, copying),
            (_, Beside::Apart(apart)) => {
                self.sample_feed(logits, at, draw, temperature, draws, tokens)?;
                return apart.run_apart(self);
            }
        };
        self.draw_fed(logits, at, (draw, temperature), draws, (target, Some(&copying)))
    }

    /// The draw of a fed choice ([`Session::sample_feed`]): its draws written into the next
    /// page-locked buffer, the ids into `out` and that buffer, with `copying` beside it.
    fn draw_fed(
        &mut self,
        logits: &str,
        at: SampledRows,
        draw: (RowDraw, f64),
        draws: &[f64],
        (out, copying): (u64, Option<&RowCopyLaunch>),
    ) -> Result<(), RuntimeError> {
        let (slot, mapped) = self.feed_draws(at.rows, draws)?;
        self.launch_sample(logits, at, draw, draws, SampleTo { out, mapped: Some(mapped), copying })?;
        self.fed_back(slot, None, at.rows)
    }

    /// What a choice with `cache`'s copy beside it needs: the device address of `tokens` (for
    /// `rows` ids, checked as [`Session::fed_input`] checks it), and the copy as blocks of the
    /// choice's launch or, where it cannot be one launch's (its rows not whole words, more
    /// than two sets), as a copy to run apart after the choice.
    fn copy_beside(
        &mut self,
        tokens: &str,
        rows: usize,
        cache: CacheCopy<'_>,
    ) -> Result<(u64, Beside), RuntimeError> {
        let resolved = self.resolve_copy(cache)?;
        let (_, out) = self.fed_input(tokens, rows)?;
        let ResolvedCopy { bases, targets, copy, writes } = &resolved;
        Ok(match self.row_copy_launch(bases, targets, *copy, writes)? {
            Some(copying) => (out, Beside::Launch(copying)),
            None => (out, Beside::Apart(resolved)),
        })
    }

    /// The arena offset and device address of `tokens`, an i64 `[rows, 1]` input the next run
    /// reads, checked to take fed ids, with room for another copy in flight.
    fn fed_input(&self, tokens: &str, rows: usize) -> Result<(usize, u64), RuntimeError> {
        let spec = self.input_to_write(tokens)?;
        if spec.dtype != "i64" || spec.shape != [rows, 1] || spec.inside.is_some() {
            return Err(RuntimeError::Input(format!(
                "input '{tokens}' ({}{:?}) is not the i64 [{rows}, 1] ids a step takes",
                spec.dtype, spec.shape
            )));
        }
        let Location::Arena(offset) = spec.location else {
            return Err(RuntimeError::Input(format!("input '{tokens}' is not in the arena")));
        };
        if self.state.feed.pending.len() >= IN_FLIGHT {
            return Err(RuntimeError::Input(format!(
                "{IN_FLIGHT} fed token copies are pending: take one (fed_tokens) first"
            )));
        }
        Ok((offset, self.address(spec.location)))
    }

    /// The next page-locked buffer, [`Session::feed_buffer`], with `draws` (a row each) written
    /// after its ids, and the device addresses of both: a drawing kernel reads the draws from
    /// there (no copy on the stream). The buffer's last use, [`IN_FLIGHT`] feeds ago, was
    /// taken (`fed_input` allows no more pending), so its kernel is done with it.
    fn feed_draws(&mut self, rows: usize, draws: &[f64]) -> Result<(usize, (u64, u64)), RuntimeError> {
        let (slot, ids) = self.feed_buffer(rows)?;
        if draws.len() != rows {
            return Err(RuntimeError::Input(format!("{} draws for {rows} rows", draws.len())));
        }
        let (buffer, _, _) = &mut self.state.feed.host[slot];
        let bytes = buffer.as_mut_slice().map_err(driver)?;
        for (chunk, u) in bytes[rows * 8..rows * 16].chunks_exact_mut(8).zip(draws) {
            chunk.copy_from_slice(&u.to_le_bytes());
        }
        Ok((slot, (ids, ids + (rows * 8) as u64)))
    }

    /// The next page-locked buffer for `rows` ids and as many draws (made or grown here,
    /// mapped for the device) and its device address.
    fn feed_buffer(&mut self, rows: usize) -> Result<(usize, u64), RuntimeError> {
        let slot = self.state.feed.issued % IN_FLIGHT;
        self.make_feed_buffer(slot, rows)?;
        Ok((slot, self.state.feed.host[slot].1))
    }

    /// Makes every page-locked buffer a fed copy may take, for `rows` ids (and draws), and the
    /// argmax kernel's slots for `rows` rows, where they are not made yet: a decoding loop's
    /// first steps then allocate nothing. On an H200 the first step at 32 rows spent 1.4–1.5
    /// ms in the page-locked allocation (with a step in flight; 0.03 ms at 8 rows), which was
    /// that whole step's time (`benches/NOTES.md`, fortieth session).
    pub fn reserve_feed(&mut self, rows: usize) -> Result<(), RuntimeError> {
        // (A buffer whose ids are not taken yet is left as it is.)
        for slot in 0..IN_FLIGHT {
            if self.state.feed.pending.iter().all(|&(pending, _)| pending != slot) {
                self.make_feed_buffer(slot, rows)?;
            }
        }
        self.make_argmax_slots(rows)
    }

    /// The argmax kernel's slots (two words a row, zero between launches) for `rows` rows, made
    /// where they are fewer.
    fn make_argmax_slots(&mut self, rows: usize) -> Result<(), RuntimeError> {
        if self.state.argmax_slots.as_ref().is_none_or(|s| s.len() < 2 * rows) {
            self.state.argmax_slots = Some(self.stream.alloc_zeros::<u64>(2 * rows.max(1)).map_err(driver)?);
        }
        Ok(())
    }

    /// Buffer `slot` of the page-locked buffers for `rows` ids and as many draws, made (or
    /// grown) where it is not that large, mapped for the device. Slots are made in order: a
    /// slot past the next is an error, not a buffer put at the next slot's place.
    fn make_feed_buffer(&mut self, slot: usize, rows: usize) -> Result<(), RuntimeError> {
        let bytes = rows * 16;
        let feed = &mut self.state.feed;
        if slot > feed.host.len() {
            return Err(RuntimeError::Driver(format!(
                "page-locked buffer {slot} asked for before buffer {}",
                feed.host.len()
            )));
        }
        if feed.host.len() == slot || feed.host[slot].0.len() < bytes {
            let context = self.stream.context();
            // Filled by the copies or kernels below before it is read.
            let (buffer, device) = super::pinned::mapped::<u8>(context, bytes)?;
            let event = context.new_event(None).map_err(driver)?;
            if feed.host.len() == slot {
                feed.host.push((buffer, device, event));
            } else {
                feed.host[slot] = (buffer, device, event);
            }
        }
        Ok(())
    }

    /// After the kernel that chose `rows` ids: where they are at arena offset `copy`, starts
    /// copying them into buffer `slot` (else the kernel wrote them there), then records the
    /// buffer's event.
    fn fed_back(&mut self, slot: usize, copy: Option<usize>, rows: usize) -> Result<(), RuntimeError> {
        let bytes = rows * 8;
        let feed = &mut self.state.feed;
        let (buffer, _, event) = &mut feed.host[slot];
        if let Some(offset) = copy {
            let source = self.arena.slice(offset..offset + bytes);
            let mut host = super::io::Prefix { inner: buffer, len: bytes };
            self.stream.memcpy_dtoh(&source, &mut host).map_err(driver)?;
        }
        event.record(&self.stream).map_err(driver)?;
        feed.pending.push_back((slot, rows));
        feed.issued += 1;
        Ok(())
    }

    /// The ids of the oldest [`Session::argmax_feed`] or [`Session::sample_feed`] not yet
    /// taken, once their copy is done.
    pub fn fed_tokens(&mut self) -> Result<Vec<i64>, RuntimeError> {
        let (slot, rows) = self
            .state
            .feed
            .pending
            .pop_front()
            .ok_or_else(|| RuntimeError::Input("no fed tokens are pending (argmax_feed first)".into()))?;
        // The buffer's last copy done (its own event: `as_slice` waits only where the context
        // tracks events, which the session's does not).
        self.state.feed.host[slot].2.synchronize().map_err(driver)?;
        // The steps before these ids done: any index they found outside its axis fails them.
        self.check_indices()?;
        let host = self.state.feed.host[slot].0.as_slice().map_err(driver)?;
        Ok(host[..rows * 8]
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect())
    }

    /// Launches the argmax kernel over `rows` rows of `width` of f32 output `name`, writing
    /// `rows` i64 ids at device address `out` (checked by the caller to hold them) and, where
    /// `host` is given, at that device address of mapped page-locked memory too.
    pub(super) fn launch_argmax(
        &mut self,
        name: &str,
        rows: usize,
        width: usize,
        (out, host): (u64, Option<u64>),
    ) -> Result<(), RuntimeError> {
        let (x, slots, chunks, items) = self.argmax_args(name, rows, width)?;
        let (function, _) = self.argmax_kernels()?;
        let config = LaunchConfig {
            grid_dim: (chunks, rows as u32, 1),
            block_dim: (ARGMAX_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (width, host) = (width as u64, host.unwrap_or(0));
        let mut args = self.stream.launch_builder(&function);
        args.arg(&x).arg(&out).arg(&width).arg(&slots).arg(&host).arg(&items);
        // SAFETY: the kernel reads `rows` rows of `width` f32s from the output's buffer (checked
        // by `argmax_args` to hold them), uses two words a row of the slots (allocated for
        // `rows`), and writes `rows` ids at `out` and at `host` where given, which the callers
        // checked.
        unsafe { args.launch(config) }.map_err(driver)?;
        Ok(())
    }

    /// [`Session::argmax_feed`], and the cache copy that follows a decoding step
    /// ([`Session::copy_output_rows_setting`]) in the same launch where the copy kernel can run
    /// that copy: one launch's wait the fewer a step. Else one after the other.
    pub fn argmax_feed_copying(
        &mut self,
        logits: &str,
        (rows, width): (usize, usize),
        tokens: &str,
        cache: CacheCopy<'_>,
    ) -> Result<(), RuntimeError> {
        let (out, copying) = match self.copy_beside(tokens, rows, cache)? {
            (out, Beside::Launch(copying)) => (out, copying),
            (_, Beside::Apart(apart)) => {
                self.argmax_feed(logits, rows, width, tokens)?;
                return apart.run_apart(self);
            }
        };
        let (x, slots, chunks, items) = self.argmax_args(logits, rows, width)?;
        let (slot, host) = self.feed_buffer(rows)?;
        let (_, function) = self.argmax_kernels()?;
        let too_many = || RuntimeError::Input(format!("{rows} rows and {} copies", copying.blocks.1));
        let config = LaunchConfig {
            grid_dim: (
                chunks.max(copying.blocks.0),
                u32::try_from(rows + copying.blocks.1 as usize)
                    .ok()
                    .filter(|&r| r <= 65_535)
                    .ok_or_else(too_many)?,
                1,
            ),
            block_dim: (ARGMAX_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (width, rows_u, chunks_u, copy_blocks) =
            (width as u64, rows as u64, u64::from(chunks), u64::from(copying.blocks.0));
        let mut args = self.stream.launch_builder(&function);
        args.arg(&x).arg(&out).arg(&width).arg(&slots).arg(&host).arg(&rows_u).arg(&chunks_u).arg(&items);
        copying.push(&mut args);
        args.arg(&copy_blocks);
        // SAFETY: as `launch_argmax` for the choice (`fed_input` checked `out`, `feed_buffer`
        // made `host`), as `copy_rows` for the copy and the sets; the two touch different memory.
        unsafe { args.launch(config) }.map_err(driver)?;
        self.fed_back(slot, None, rows)
    }

    /// The argmax kernel's operands for `rows` rows of `width` of f32 output `name`: the
    /// output's address, the slots its blocks merge in (made here), the blocks a row and the
    /// logits a thread ([`argmax_items`]).
    fn argmax_args(
        &mut self,
        name: &str,
        rows: usize,
        width: usize,
    ) -> Result<(u64, u64, u32, u64), RuntimeError> {
        let spec = Self::spec(&self.outputs, name, "output")?;
        let size = spec.tensor_type().map_or(0, |t| t.size_bytes());
        if spec.dtype != "f32" || rows * width * 4 > size || width == 0 || width >= u32::MAX as usize {
            return Err(RuntimeError::Input(format!(
                "output '{name}' ({}{:?}) does not hold {rows} f32 rows of {width}",
                spec.dtype, spec.shape
            )));
        }
        let too_many = || RuntimeError::Input(format!("{rows} rows of {width}"));
        if rows > 65_535 {
            return Err(too_many());
        }
        let x = self.address(spec.location);
        self.make_argmax_slots(rows)?;
        let slots = match self.state.argmax_slots.as_ref() {
            Some(slots) => slots.device_ptr(&self.stream).0,
            None => return Err(RuntimeError::Driver("no device buffer for the argmax".into())),
        };
        let items = argmax_items(rows);
        let chunks = u32::try_from(width.div_ceil(ARGMAX_THREADS * items)).map_err(|_| too_many())?;
        Ok((x, slots, chunks, items as u64))
    }
}
