//! Host outputs handed to NumPy without a second copy: the bytes of one output copied once
//! from the device into memory of Rust's (as the Rust API's `Session::run` does), owned by a
//! small object that exports them through the buffer protocol with their element type and
//! shape, so that `numpy.asarray` makes an array over them in place.

use std::ffi::{c_int, CStr};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::InputError;
use fusec::ir::DType;

/// One output's bytes, element type and shape; `numpy.asarray` of it is a writable array
/// over the same memory (which it keeps alive).
#[pyclass(name = "HostOutput", module = "fusec._fusec", frozen)]
pub struct HostOutput {
    /// The bytes (in 8-byte words, so that every element type is aligned), freed when the
    /// object is (after the last array over it); or those of `pinned`.
    data: *mut u64,
    words: usize,
    /// Page-locked memory of the session's the bytes are in (`Session::output_pinned`), given
    /// back to it when the object is dropped.
    pinned: Option<fusec::runtime::PinnedOutput>,
    len: usize,
    itemsize: isize,
    format: &'static CStr,
    shape: Vec<isize>,
    strides: Vec<isize>,
}

// SAFETY: the object owns its bytes (nothing else refers to them but the buffers it exports,
// which hold a reference to it); they are written only by whoever holds an exported writable
// view, as with `bytearray`.
unsafe impl Send for HostOutput {}
// SAFETY: as above; shared references read only the fixed fields.
unsafe impl Sync for HostOutput {}

/// The buffer-protocol format of an element type (None: none NumPy reads, e.g. bfloat16).
pub fn format_of(dtype: DType) -> Option<&'static CStr> {
    Some(match dtype {
        DType::F32 => c"f",
        DType::F16 => c"e",
        DType::F64 => c"d",
        DType::I64 => c"q",
        DType::I32 => c"i",
        DType::Bool => c"?",
        DType::BF16 => return None,
    })
}

impl HostOutput {
    /// The first `len` bytes of `words` (elements of `dtype`, whose format `format_of` gives,
    /// shaped `shape`).
    pub fn from_words(
        words: Vec<u64>,
        len: usize,
        dtype: DType,
        format: &'static CStr,
        shape: &[usize],
    ) -> HostOutput {
        let words = words.into_boxed_slice();
        let words_len = words.len();
        let len = len.min(words_len * 8);
        let data = Box::into_raw(words).cast::<u64>();
        let (itemsize, shape, strides) = layout(dtype, shape);
        HostOutput { data, words: words_len, pinned: None, len, itemsize, format, shape, strides }
    }

    /// An output copied into page-locked memory (elements of `dtype` shaped `shape`).
    pub fn from_pinned(
        pinned: fusec::runtime::PinnedOutput,
        dtype: DType,
        format: &'static CStr,
        shape: &[usize],
    ) -> HostOutput {
        let (itemsize, shape, strides) = layout(dtype, shape);
        // Page-aligned: every element type is aligned there.
        let data = pinned.as_ptr().cast::<u64>().cast_mut();
        let len = pinned.len();
        HostOutput { data, words: 0, pinned: Some(pinned), len, itemsize, format, shape, strides }
    }
}

/// Item size, shape and C-order strides (bytes) of an array of `dtype` shaped `shape`.
fn layout(dtype: DType, shape: &[usize]) -> (isize, Vec<isize>, Vec<isize>) {
    let itemsize = dtype.size_bytes() as isize;
    let shape: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    let mut strides = vec![itemsize; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    (itemsize, shape, strides)
}

impl Drop for HostOutput {
    fn drop(&mut self) {
        if self.pinned.is_some() {
            // Given back to its session's pool as it drops.
            return;
        }
        // SAFETY: made by `Box::into_raw` of a boxed slice of `words` words in `from_words`, freed
        // once; no exported view outlives the object (each holds a reference to it).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.data, self.words)) });
    }
}

#[pymethods]
impl HostOutput {
    /// A copy of `data` as elements of `dtype` (a NumPy name) shaped `shape`.
    #[new]
    fn new(data: &[u8], dtype: &str, shape: Vec<usize>) -> PyResult<HostOutput> {
        let element = crate::session::dtype_named(dtype)?;
        let format = format_of(element)
            .ok_or_else(|| InputError::new_err(format!("NumPy has no element type '{dtype}'")))?;
        let want = shape.iter().product::<usize>() * element.size_bytes();
        if data.len() != want {
            return Err(InputError::new_err(format!(
                "{} bytes given for {want} ({dtype} of shape {shape:?})",
                data.len()
            )));
        }
        let mut words = vec![0u64; data.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(data.chunks(8)) {
            let mut le = [0u8; 8];
            le[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(le);
        }
        Ok(HostOutput::from_words(words, data.len(), element, format, &shape))
    }

    /// Exports the bytes: writable, C-contiguous, with the element format and shape where the
    /// consumer asks for them.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        let this = slf.get();
        // SAFETY: `view` is the consumer's Py_buffer to fill (checked non-null); every pointer
        // stored in it (bytes, format, shape, strides) lives as long as the object, which the
        // view holds a reference to (`obj`) until it is released.
        unsafe {
            (*view).buf = this.data.cast();
            (*view).len = this.len as isize;
            (*view).readonly = 0;
            (*view).itemsize = this.itemsize;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
                this.format.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            let nd = flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
            (*view).ndim = if nd { this.shape.len() as c_int } else { 1 };
            (*view).shape = if nd { this.shape.as_ptr().cast_mut() } else { std::ptr::null_mut() };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                this.strides.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    /// Nothing to release: the bytes live as long as the object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
