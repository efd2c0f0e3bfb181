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

/// Frees a managed tensor and what it holds (the owner's reference dropped with the GIL).
unsafe extern "C" fn delete_managed(tensor: *mut DLManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: made by `capsule` from a Box, freed once (by its consumer or the capsule).
    let managed = unsafe { Box::from_raw(tensor) };
    // SAFETY: the holder was boxed by `capsule` and belongs to this tensor alone.
    let mut holder = unsafe { Box::from_raw(managed.manager_ctx.cast::<Holder>()) };
    if let Some(owner) = holder.owner.take() {
        Python::attach(|_| drop(owner));
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
