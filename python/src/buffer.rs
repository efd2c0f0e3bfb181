//! Host arrays (NumPy's, or anything with the buffer protocol) read in place: a C-contiguous
//! view's element type, shape and bytes, released when dropped.

use std::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::InputError;
use fusec::ir::DType;

/// A C-contiguous buffer of an object, held until dropped.
pub struct HostArray {
    view: Box<ffi::Py_buffer>,
    /// The element type its format names.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl HostArray {
    /// The buffer of `object`, given for input `name` (named in errors).
    pub fn new(object: &Bound<'_, PyAny>, name: &str) -> PyResult<HostArray> {
        let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
        let flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT;
        // SAFETY: fills `view` (released in Drop when this succeeds) from a live object.
        if unsafe { ffi::PyObject_GetBuffer(object.as_ptr(), &mut *view, flags) } != 0 {
            let cause = PyErr::take(object.py()).map_or(String::new(), |e| format!(": {e}"));
            return Err(InputError::new_err(format!(
                "input '{name}' is not a C-contiguous array (pass numpy.ascontiguousarray(...)){cause}"
            )));
        }
        let format = if view.format.is_null() {
            "B".to_string()
        } else {
            // SAFETY: a NUL-terminated format string the exporter owns while the view lives.
            unsafe { CStr::from_ptr(view.format) }.to_string_lossy().into_owned()
        };
        let ndim = usize::try_from(view.ndim).unwrap_or(0);
        let shape = if view.shape.is_null() || ndim == 0 {
            vec![]
        } else {
            // SAFETY: `ndim` sizes, owned by the exporter while the view lives.
            unsafe { std::slice::from_raw_parts(view.shape, ndim) }
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect()
        };
        let itemsize = usize::try_from(view.itemsize).unwrap_or(0);
        let mut array = HostArray { view, dtype: DType::F32, shape };
        array.dtype = dtype_of(&format, itemsize).ok_or_else(|| {
            InputError::new_err(format!(
                "input '{name}' has elements of buffer format '{format}' ({itemsize} bytes): fusec takes \
                 float32, float16, float64, int64, int32 and bool"
            ))
        })?;
        Ok(array)
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: `len` bytes of a contiguous buffer, kept by the view until it is released.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }
}

impl Drop for HostArray {
    fn drop(&mut self) {
        // SAFETY: the view was filled by PyObject_GetBuffer and is released once; the GIL is
        // held (arrays live only inside calls that hold it).
        unsafe { ffi::PyBuffer_Release(&mut *self.view) };
    }
}

/// The element type of a buffer format (struct module syntax, byte order prefix allowed).
fn dtype_of(format: &str, itemsize: usize) -> Option<DType> {
    // Native or little-endian order only ('>' and '!' are big-endian).
    let code = format.strip_prefix(['@', '=', '<']).unwrap_or(format);
    match (code, itemsize) {
        ("f", 4) => Some(DType::F32),
        ("e", 2) => Some(DType::F16),
        ("d", 8) => Some(DType::F64),
        ("q" | "l", 8) => Some(DType::I64),
        ("i" | "l", 4) => Some(DType::I32),
        ("?", 1) => Some(DType::Bool),
        _ => None,
    }
}
