//! One column of a rank-2 input set to one value in every row, on the device: a decoding
//! step's attention mask gains a position, its position input the next one, without writing
//! either whole. On its own (2-D memsets) or in the launch that copies the step's new keys and
//! values into the cache (`Session::copy_output_rows_setting`): the next step's inputs then
//! cost no launch of their own.

use cudarc::driver::sys;

use super::{driver, RuntimeError, Session};
use crate::ir::{DType, Tensor};

/// Column `column` of `[rows, columns]` input `input` set to `value` in the input's element type.
#[derive(Clone, Copy, Debug)]
pub struct ColumnSet<'a> {
    /// The input's name.
    pub input: &'a str,
    /// The column set in every row.
    pub column: usize,
    /// The value, converted to the input's element type.
    pub value: f64,
}

/// A decoding step's cache copy: rows `copy` of each output of `pairs` into the input beside
/// it, and `sets` applied in the same launch where it can be
/// ([`Session::copy_output_rows_setting`], [`Session::argmax_feed_copying`]).
#[derive(Clone, Copy, Debug)]
pub struct CacheCopy<'a> {
    /// (output, input) pairs.
    pub pairs: &'a [(&'a str, &'a str)],
    /// The rows copied, the same for every pair.
    pub copy: super::RowCopy,
    /// Columns set with it (at most two share its launch).
    pub sets: &'a [ColumnSet<'a>],
}

/// A [`ColumnSet`] resolved on the device: the first row's element, the bytes from one row's
/// to the next, the rows, the element's bytes (little-endian, in the low bytes) and its size.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(super) struct ColumnWrite {
    pub address: u64,
    pub pitch: u64,
    pub rows: u64,
    pub bits: u64,
    pub bytes: u64,
}

// SAFETY: five u64s, laid out as the kernels' `ColumnSet` (`kernels/copy_rows.cuh`).
unsafe impl cudarc::driver::DeviceRepr for ColumnWrite {}

/// A [`CacheCopy`] resolved on the device ([`Session::resolve_copy`]): the first rows'
/// addresses of each pair (sources, then targets), the rows, and the column writes.
pub(super) struct ResolvedCopy {
    pub bases: Vec<u64>,
    pub targets: Vec<u64>,
    pub copy: super::RowCopy,
    pub writes: Vec<ColumnWrite>,
}

impl ResolvedCopy {
    /// The copy without the copy kernel ([`Session::copy_rows_apart`]).
    pub fn run_apart(&self, session: &mut Session) -> Result<(), RuntimeError> {
        session.copy_rows_apart(&self.bases, &self.targets, self.copy, &self.writes)
    }
}

impl Session {
    /// Sets column `column` of every row of rank-2 input `name` (`[rows, columns]`) to
    /// `value` in its element type, on the device, in stream order before the next run: one
    /// 2D memset (two for 8-byte elements), no host buffer. A decoding step's attention mask
    /// gains a position this way rather than being written whole every step.
    pub fn set_input_column(&mut self, name: &str, column: usize, value: f64) -> Result<(), RuntimeError> {
        let write = self.column_write(ColumnSet { input: name, column, value })?;
        self.write_column(&write)
    }

    /// Where and what `set` writes, checked: `[rows, columns]` input of one size, the column
    /// inside it, an element of 1, 2, 4 or 8 bytes.
    pub(super) fn column_write(&self, set: ColumnSet<'_>) -> Result<ColumnWrite, RuntimeError> {
        let name = set.input;
        let spec = self.input_to_write(name)?;
        let [rows, columns] = spec.shape[..] else {
            return Err(RuntimeError::Input(format!(
                "input '{name}' is not [rows, columns]: {:?}",
                spec.shape
            )));
        };
        if set.column >= columns {
            return Err(RuntimeError::Input(format!("input '{name}': column {} of {columns}", set.column)));
        }
        let dtype = DType::from_name(&spec.dtype)
            .ok_or_else(|| RuntimeError::Input(format!("input '{name}' has type {}", spec.dtype)))?;
        let size = dtype.size_bytes();
        if ![1, 2, 4, 8].contains(&size) {
            return Err(RuntimeError::Input(format!("input '{name}' has {size}-byte elements")));
        }
        let one = ndarray::ArrayD::from_elem(ndarray::IxDyn(&[1]), set.value);
        let mut bytes = [0u8; 8];
        crate::plan::write_tensor_bytes(&mut bytes[..size], &Tensor::from_f64(one, dtype));
        Ok(ColumnWrite {
            address: self.address(spec.location) + (set.column * size) as u64,
            pitch: (columns * size) as u64,
            rows: rows as u64,
            bits: u64::from_le_bytes(bytes),
            bytes: size as u64,
        })
    }

    /// `write` by 2-D memsets on the session's stream: one of the element's size, or one a
    /// 4-byte word of an 8-byte element.
    pub(super) fn write_column(&self, write: &ColumnWrite) -> Result<(), RuntimeError> {
        let (start, pitch, height) = (write.address, write.pitch as usize, write.rows as usize);
        let stream = self.stream.cu_stream();
        // SAFETY: `height` rows of an input's buffer, one element each at `start` and `pitch`
        // bytes apart (within the buffer: `column_write` checked the column), on the session's
        // stream.
        unsafe {
            match write.bytes {
                1 => sys::cuMemsetD2D8Async(start, pitch, write.bits as u8, 1, height, stream).result(),
                2 => sys::cuMemsetD2D16Async(start, pitch, write.bits as u16, 1, height, stream).result(),
                bytes => (0..bytes / 4).try_for_each(|w| {
                    let word = (write.bits >> (32 * w)) as u32;
                    sys::cuMemsetD2D32Async(start + 4 * w, pitch, word, 1, height, stream).result()
                }),
            }
        }
        .map_err(driver)
    }

    /// [`Session::copy_output_rows_many`] and `sets` (at most two) in one launch, where the
    /// copy runs as a kernel; else the copy, then each set on its own. A decoding step's new
    /// keys and values go into the cache and the next step's position and mask slot are set
    /// together.
    pub fn copy_output_rows_setting(&mut self, cache: CacheCopy<'_>) -> Result<(), RuntimeError> {
        let ResolvedCopy { bases, targets, copy, writes } = self.resolve_copy(cache)?;
        self.copy_rows(bases, targets, copy, &writes)
    }

    /// `cache` as the copy kernels take it, each address checked.
    pub(super) fn resolve_copy(&self, cache: CacheCopy<'_>) -> Result<ResolvedCopy, RuntimeError> {
        let (bases, targets) = self.row_addresses(self, cache.pairs, cache.copy)?;
        let writes = cache.sets.iter().map(|&set| self.column_write(set)).collect::<Result<Vec<_>, _>>()?;
        Ok(ResolvedCopy { bases, targets, copy: cache.copy, writes })
    }
}
