//! Device buffers handed to PyTorch (or any DLPack consumer) without a copy: a DLPack
//! capsule (`"dltensor"`) describing the buffer, which keeps the session that owns the
//! memory alive until the consumer's tensor is freed.

use std::ffi::{c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

use fusec::ir::DType;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What a managed tensor owns: its shape array and a reference to the memory's owner.
struct Holder {
    shape: Vec<i64>,
    owner: Option<Py<PyAny>>,
}

const KDL_CUDA: i32 = 2;
const NAME: &CStr = c"dltensor";

fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (2, 32),
        DType::F16 => (2, 16),
        DType::F64 => (2, 64),
        DType::BF16 => (4, 16),
        DType::I64 => (0, 64),
        DType::I32 => (0, 32),
        DType::Bool => (6, 8),
    };
    DLDataType { code, bits, lanes: 1 }
}

/// Frees a managed tensor and what it holds (the owner's reference dropped with the GIL, while
/// there is an interpreter).
unsafe extern "C" fn delete_managed(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: made by `capsule` from a Box, freed once (by its consumer or the capsule).
    let managed = unsafe { Box::from_raw(tensor) };
    // SAFETY: the holder was boxed by `capsule` and belongs to this tensor alone.
    let mut holder = unsafe { Box::from_raw(managed.manager_ctx.cast::<Holder>()) };
    if let Some(owner) = holder.owner.take() {
        // A consumer's tensor may outlive the interpreter (freed by its library at process
        // exit): the reference is then let go without touching Python, as the interpreter
        // has already let go of everything.
        // SAFETY: a query the C API allows at any time.
        if unsafe { ffi::Py_IsInitialized() } != 0 {
            Python::attach(|_| drop(owner));
        } else {
            std::mem::forget(owner);
        }
    }
}

/// A capsule nobody consumed frees its tensor; a consumed one (renamed `used_dltensor`)
/// belongs to its consumer.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is the capsule being destroyed; its pointer is a managed tensor.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
            delete_managed(tensor);
        }
    }
}

/// A DLPack capsule of `dtype` elements of `shape`, contiguous, at device address `address`
/// of CUDA device `device`; `owner` is kept alive until the consumer frees the tensor.
pub fn capsule(
    py: Python<'_>,
    address: u64,
    device: usize,
    dtype: DType,
    shape: &[usize],
    owner: Py<PyAny>,
) -> PyResult<Py<PyAny>> {
    let mut holder =
        Box::new(Holder { shape: shape.iter().map(|&d| d as i64).collect(), owner: Some(owner) });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: address as *mut c_void,
            device: DLDevice { device_type: KDL_CUDA, device_id: device as i32 },
            ndim: shape.len() as i32,
            dtype: dl_dtype(dtype),
            shape: holder.shape.as_mut_ptr(),
            // Null strides: compact row-major.
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(holder).cast::<c_void>(),
        deleter: Some(delete_managed),
    });
    let raw = Box::into_raw(managed);
    // SAFETY: a capsule of the managed tensor, named as DLPack asks, with a destructor that
    // frees it unless a consumer took it.
    let capsule =
        unsafe { ffi::PyCapsule_New(raw.cast::<c_void>(), NAME.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made: the tensor is still ours to free.
        unsafe { delete_managed(raw) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference just returned by PyCapsule_New.
    Ok(unsafe { Py::from_owned_ptr(py, capsule) })
}

/// A device tensor borrowed from a DLPack capsule (left unconsumed: its producer frees it
/// when the capsule goes, after the call that borrowed it).
pub struct Borrowed {
    /// The address of its first element.
    pub address: u64,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
}

fn dtype_of(dtype: &DLDataType) -> Option<DType> {
    match (dtype.code, dtype.bits, dtype.lanes) {
        (2, 32, 1) => Some(DType::F32),
        (2, 16, 1) => Some(DType::F16),
        (2, 64, 1) => Some(DType::F64),
        (4, 16, 1) => Some(DType::BF16),
        (0, 64, 1) => Some(DType::I64),
        (0, 32, 1) => Some(DType::I32),
        (6, 8, 1) | (1, 8, 1) => Some(DType::Bool),
        _ => None,
    }
}

/// Reads the tensor of DLPack capsule `capsule`, given for input `name`: a CUDA tensor of
/// device `device`, compact and row-major. The error names the input and what is wrong.
pub fn borrow(capsule: &Bound<'_, PyAny>, name: &str, device: usize) -> PyResult<Borrowed> {
    use crate::errors::InputError;
    // SAFETY: reads the pointer of a live capsule of the name DLPack gives unconsumed tensors.
    let tensor =
        unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), NAME.as_ptr()) }.cast::<DLManagedTensor>();
    if tensor.is_null() {
        let cause = PyErr::take(capsule.py()).map_or(String::new(), |e| format!(": {e}"));
        return Err(InputError::new_err(format!("input '{name}': not an unconsumed DLPack capsule{cause}")));
    }
    // SAFETY: the producer keeps the managed tensor alive while the capsule lives, which the
    // caller holds for this call.
    let t = unsafe { &(*tensor).dl_tensor };
    if t.device.device_type != KDL_CUDA || usize::try_from(t.device.device_id).ok() != Some(device) {
        return Err(InputError::new_err(format!(
            "input '{name}' is on DLPack device ({}, {}): the session runs on CUDA device {device}",
            t.device.device_type, t.device.device_id
        )));
    }
    let dtype = dtype_of(&t.dtype).ok_or_else(|| {
        InputError::new_err(format!(
            "input '{name}' has DLPack type code {} of {} bits: not an element type fusec takes",
            t.dtype.code, t.dtype.bits
        ))
    })?;
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    let read = |p: *mut i64| -> Vec<i64> {
        if p.is_null() || ndim == 0 {
            Vec::new()
        } else {
            // SAFETY: `ndim` values owned by the managed tensor.
            unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec()
        }
    };
    let shape: Vec<usize> = read(t.shape).into_iter().map(|d| d.max(0) as usize).collect();
    let strides = read(t.strides);
    let mut expected = 1i64;
    let compact = strides.is_empty()
        || shape.iter().zip(&strides).rev().all(|(&d, &s)| {
            let ok = d <= 1 || s == expected;
            expected *= d as i64;
            ok
        });
    if !compact {
        return Err(InputError::new_err(format!(
            "input '{name}' has strides {strides:?} for shape {shape:?}: fusec takes compact row-major tensors \
             (make it contiguous first)"
        )));
    }
    Ok(Borrowed { address: (t.data as u64).wrapping_add(t.byte_offset), dtype, shape })
}
