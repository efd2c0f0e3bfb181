//! Outputs copied to the host into page-locked memory that the caller then owns: the
//! device's copy lands there directly (a DMA, ~2.5× the rate of a copy into pageable memory,
//! which the driver stages through a buffer of its own and copies out with the CPU, evicting
//! the caller's working set from the CPU's caches). The buffers come from a pool per session
//! and go back to it when the caller drops them, so that a run does not allocate page-locked
//! memory (which costs far more than the copy).

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{sys, PinnedHostSlice};

use super::{driver, RuntimeError, Session};

/// Outputs smaller than this are copied into new pageable memory as before: the copy is
/// short either way.
pub const PINNED_MIN_BYTES: usize = 64 << 10;
/// Page-locked bytes handed out and not yet given back, at most, per session: past it,
/// outputs go into new pageable memory (a caller keeping every output of many runs does not
/// lock the machine's memory).
const HANDED_OUT_MAX: usize = 256 << 20;
/// Page-locked bytes kept for reuse, at most, per session.
const KEPT_MAX: usize = 256 << 20;

/// The page-locked buffers of a session that are free, and what is handed out.
#[derive(Default)]
pub(super) struct Pool {
    free: Vec<PinnedHostSlice<u8>>,
    handed_out: usize,
}

/// An output of a run in page-locked memory of the caller's ([`Session::output_pinned`]),
/// given back to the session's pool when dropped.
pub struct PinnedOutput {
    buffer: Option<PinnedHostSlice<u8>>,
    ptr: *const u8,
    len: usize,
    pool: Arc<Mutex<Pool>>,
}

// SAFETY: the buffer is plain host memory owned by this value; the pool is behind a mutex.
unsafe impl Send for PinnedOutput {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for PinnedOutput {}

impl PinnedOutput {
    /// The output's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes written by the copy from the device, owned while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Where they start (page-aligned: any element type is aligned there).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedOutput {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else { return };
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.handed_out = pool.handed_out.saturating_sub(buffer.num_bytes());
        let kept: usize = pool.free.iter().map(PinnedHostSlice::num_bytes).sum();
        if kept + buffer.num_bytes() <= KEPT_MAX {
            pool.free.push(buffer);
        }
    }
}

/// `len` elements of page-locked host memory mapped for the device (not initialised), and the
/// address the device reads and writes it at.
pub(super) fn mapped<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    context: &Arc<cudarc::driver::CudaContext>,
    len: usize,
) -> Result<(PinnedHostSlice<T>, u64), RuntimeError> {
    // SAFETY: host memory its users write before they read it.
    let buffer = unsafe { context.alloc_pinned_with_flags::<T>(len, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
        .map_err(driver)?;
    let host = buffer.as_ptr().map_err(driver)?;
    let mut device = 0;
    // SAFETY: `host` is the start of a live allocation made with DEVICEMAP just above.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut _, 0) }.result().map_err(driver)?;
    Ok((buffer, device))
}

impl Session {
    /// Output `k` of the last run copied from the device into page-locked memory that the
    /// caller owns until it drops it (then it goes back to the session's pool), waited for.
    /// `None` where the output is smaller than [`PINNED_MIN_BYTES`], the session has handed
    /// out its limit or the driver has no page-locked memory to give: take
    /// [`Session::output_words`] then.
    pub fn output_pinned(&self, k: usize) -> Result<Option<PinnedOutput>, RuntimeError> {
        let len = self.output_at(k)?.0.size_bytes();
        if len < PINNED_MIN_BYTES {
            return Ok(None);
        }
        let mut buffer = {
            let mut pool = self.pinned.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.handed_out + len > HANDED_OUT_MAX {
                return Ok(None);
            }
            // The smallest free buffer it fits, else a new one.
            let fit = (0..pool.free.len())
                .filter(|&i| pool.free[i].num_bytes() >= len)
                .min_by_key(|&i| pool.free[i].num_bytes());
            let buffer = match fit {
                Some(i) => pool.free.swap_remove(i),
                // SAFETY: host memory the copy below writes in full before it is read.
                None => match unsafe { self.stream.context().alloc_pinned_with_flags::<u8>(len, 0) } {
                    Ok(buffer) => buffer,
                    Err(e) => {
                        // Page-locked memory is scarcer than pageable: the caller copies into
                        // new memory instead.
                        tracing::debug!("page-locked memory for output {k} ({len} bytes): {e:?}");
                        return Ok(None);
                    }
                },
            };
            pool.handed_out += buffer.num_bytes();
            buffer
        };
        let ptr = buffer.as_mut_ptr();
        // Given back to the pool when dropped, also on an error below.
        let mut output =
            PinnedOutput { buffer: Some(buffer), ptr: std::ptr::null(), len, pool: Arc::clone(&self.pinned) };
        let ptr = ptr.map_err(driver)?;
        // SAFETY: the buffer holds at least `len` bytes; `output_to_raw` checks `len` is the
        // output's size and writes all of them before returning Ok.
        unsafe { self.output_to_raw(k, ptr, len)? };
        output.ptr = ptr;
        Ok(Some(output))
    }
}
