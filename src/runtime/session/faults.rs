//! Indices outside their axis, reported by the kernels. A generated gather reads each index
//! through `fusec::checked_index` (`kernels/fusec.cuh`): one outside its axis is replaced by 0
//! (no read leaves the table), and the gathering node's code with the index read (one 64-bit
//! store: the code above bit 40) is written to a word of page-locked host memory mapped for the
//! device, whose address every module that reads it is given at load (`fusec_index_faults`).
//! After each wait for a run's results the session reads the word: a report there fails the
//! call with the node, its indices, the axis and the index named
//! ([`crate::codegen::index_checks`]), and the word is cleared for the next run. A run with no
//! bad index costs nothing more: the word is written only when one is found.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream, PinnedHostSlice};

use super::{driver, RuntimeError};

/// The name of the module global that points at the word.
const GLOBAL: &str = "fusec_index_faults";

/// The word the kernels report into, and what its codes stand for.
pub(super) struct IndexFaults {
    /// Keeps the page-locked word allocated.
    _word: PinnedHostSlice<u64>,
    /// The word on the host and as the device addresses it.
    host: *mut u64,
    device: u64,
    table: BTreeMap<u32, String>,
}

// SAFETY: `host` points into `_word`, owned by this value; it is read and written only through
// volatile accesses of one aligned word (a kernel's write either has happened or not).
unsafe impl Send for IndexFaults {}
// SAFETY: as above; the accesses are single aligned words.
unsafe impl Sync for IndexFaults {}

impl IndexFaults {
    /// The word for a bundle whose table is `table`, or `None` where it has no checks (its
    /// kernels report nothing).
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        table: &BTreeMap<u32, String>,
    ) -> Result<Option<Self>, RuntimeError> {
        if table.is_empty() {
            return Ok(None);
        }
        // Zeroed below before any kernel can read it.
        let (word, device) = super::pinned::mapped::<u64>(stream.context(), 1)?;
        let host = word.as_ptr().map_err(driver)? as *mut u64;
        // SAFETY: one aligned word of the allocation above.
        unsafe { std::ptr::write_volatile(host, 0) };
        Ok(Some(IndexFaults { _word: word, host, device, table: table.clone() }))
    }

    /// Points `module`'s global at the word, where the module has one (every generated kernel's
    /// does; the library kernels' do not), in stream order before any of its kernels runs.
    pub(super) fn install(
        &self,
        module: &Arc<CudaModule>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), RuntimeError> {
        let Ok(mut global) = module.get_global(GLOBAL, stream) else { return Ok(()) };
        stream.memcpy_htod(&self.device.to_le_bytes(), &mut global).map_err(driver)
    }

    /// Fails with the node a kernel reported since the last check, and clears the report. Call
    /// only after waiting for the runs to check.
    pub(super) fn check(&self) -> Result<(), RuntimeError> {
        // SAFETY: one aligned word of the live allocation; the kernels that wrote it are done.
        let report = unsafe { std::ptr::read_volatile(self.host) };
        if report == 0 {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { std::ptr::write_volatile(self.host, 0) };
        Err(RuntimeError::IndexOutOfRange(describe(report, &self.table)))
    }
}

/// A report (the code above bit 40, the index read in the 40 bits below, sign-extended; -2^39
/// for one that 40 bits cannot hold) as the error's text.
fn describe(report: u64, table: &BTreeMap<u32, String>) -> String {
    let code = (report >> 40) as u32;
    let read = ((report << 24) as i64) >> 24;
    let what = table.get(&code).cloned().unwrap_or_else(|| "a gather's index lies outside its axis".into());
    if read == -(1 << 39) {
        format!("{what}: it read one beyond ±2^39")
    } else {
        format!("{what}: it read {read}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_back_as_written() {
        let table = BTreeMap::from([(45, "Gather node 'wpe'".to_string())]);
        let report = |code: u64, read: i64| (code << 40) | (read as u64 & ((1 << 40) - 1));
        assert_eq!(describe(report(45, 64), &table), "Gather node 'wpe': it read 64");
        assert_eq!(describe(report(45, -65), &table), "Gather node 'wpe': it read -65");
        assert_eq!(describe(report(45, (1 << 39) - 1), &table), "Gather node 'wpe': it read 549755813887");
        assert!(describe(report(45, -(1 << 39)), &table).ends_with("it read one beyond ±2^39"));
        assert!(describe(report(7, 3), &table).starts_with("a gather's index lies outside its axis"));
    }
}
