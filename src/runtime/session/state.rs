//! State kept on the device between runs (a decoder's key/value cache): inputs written one
//! at a time, others left as the last run or copy left them, one output read back, and rows
//! copied from an output into an input without a trip through the host.

use cudarc::driver::sys;

use super::{driver, tensor_from_bytes, RuntimeError, Session};
use crate::bundle::IoSpec;
use crate::ir::{DType, Tensor};

/// Rows of bytes copied from an output into an input, both on the device: `rows` rows of
/// `width` bytes, row `r` from `from_offset + r · from_pitch` of the output to
/// `to_offset + r · to_pitch` of the input.
#[derive(Clone, Copy, Debug)]
pub struct RowCopy {
    /// Rows copied.
    pub rows: usize,
    /// Bytes a row.
    pub width: usize,
    /// The first row's first byte in the output.
    pub from_offset: usize,
    /// Bytes from a row to the next in the output.
    pub from_pitch: usize,
    /// The first row's first byte in the input.
    pub to_offset: usize,
    /// Bytes from a row to the next in the input.
    pub to_pitch: usize,
}

impl Session {
    fn spec<'a>(list: &'a [IoSpec], name: &str, what: &str) -> Result<&'a IoSpec, RuntimeError> {
        list.iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
            RuntimeError::Input(format!("the model has no {what} '{name}' (it has {})", names.join(", ")))
        })
    }

    /// Writes input `name` from a host tensor of its type and shape, leaving the other inputs
    /// as they are (for a bundle of one size).
    pub fn write_input(&mut self, name: &str, tensor: &Tensor) -> Result<(), RuntimeError> {
        let spec = Self::spec(&self.inputs, name, "input")?;
        if !self.ranges.is_empty() {
            return Err(RuntimeError::Input(format!(
                "input '{name}': writing one input at a time needs a bundle of one size"
            )));
        }
        if tensor.dtype().name() != spec.dtype || tensor.shape() != spec.shape.as_slice() {
            return Err(RuntimeError::Input(format!(
                "input '{name}' is {}{:?}, the tensor given is {}{:?}",
                spec.dtype,
                spec.shape,
                tensor.dtype(),
                tensor.shape()
            )));
        }
        let (ptr, bytes) = (self.address(spec.location), tensor.size_bytes());
        let mut host = vec![0u8; bytes];
        crate::plan::write_tensor_bytes(&mut host, tensor);
        // SAFETY: `ptr` is the input's buffer of at least `bytes` bytes in this session's
        // memory; the copy is on the session's stream, which the host waits for before `host`
        // is dropped.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(ptr, host.as_ptr().cast(), bytes, self.stream.cu_stream())
                .result()
                .map_err(driver)?;
        }
        self.stream.synchronize().map_err(driver)
    }

    /// Sets every byte of input `name` to zero on the device.
    pub fn zero_input(&mut self, name: &str) -> Result<(), RuntimeError> {
        let spec = Self::spec(&self.inputs, name, "input")?;
        let bytes = spec.tensor_type().map_or(0, |t| t.size_bytes());
        let ptr = self.address(spec.location);
        // SAFETY: the input's buffer of `bytes` bytes, on the session's stream.
        unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, self.stream.cu_stream()).result().map_err(driver) }
    }

    /// Output `name` of the last run, copied to the host.
    pub fn read_output(&mut self, name: &str) -> Result<Tensor, RuntimeError> {
        let spec = Self::spec(&self.outputs, name, "output")?;
        let dtype = DType::from_name(&spec.dtype)
            .ok_or_else(|| RuntimeError::Driver(format!("output '{name}' has type {}", spec.dtype)))?;
        let shape = spec.shape_at(&self.point);
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        let ptr = self.address(spec.location);
        let mut host = vec![0u8; bytes];
        // SAFETY: the output's buffer of `bytes` bytes; the host waits for the copy before
        // reading `host`.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, bytes, self.stream.cu_stream())
                .result()
                .map_err(driver)?;
        }
        self.stream.synchronize().map_err(driver)?;
        tensor_from_bytes(&host, &shape, dtype)
    }

    /// Copies rows of output `from` of the last run into input `to` on the device (in stream
    /// order: before the next run reads it).
    pub fn copy_output_rows(&mut self, from: &str, to: &str, copy: RowCopy) -> Result<(), RuntimeError> {
        let (source, target) =
            (Self::spec(&self.outputs, from, "output")?, Self::spec(&self.inputs, to, "input")?);
        let size = |s: &IoSpec| s.tensor_type().map_or(0, |t| t.size_bytes());
        let last = |offset: usize, pitch: usize| offset + (copy.rows.max(1) - 1) * pitch + copy.width;
        if copy.rows > 0
            && (last(copy.from_offset, copy.from_pitch) > size(source)
                || last(copy.to_offset, copy.to_pitch) > size(target))
        {
            return Err(RuntimeError::Input(format!(
                "a copy of rows from output '{from}' to input '{to}' runs past one of them"
            )));
        }
        let params = sys::CUDA_MEMCPY2D {
            srcXInBytes: copy.from_offset,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: self.address(source.location),
            srcArray: std::ptr::null_mut(),
            srcPitch: copy.from_pitch,
            dstXInBytes: copy.to_offset,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: self.address(target.location),
            dstArray: std::ptr::null_mut(),
            dstPitch: copy.to_pitch,
            WidthInBytes: copy.width,
            Height: copy.rows,
        };
        // SAFETY: both ends lie inside the output's and the input's buffers (checked above),
        // which the session owns; the copy is on the session's stream.
        unsafe { sys::cuMemcpy2DAsync_v2(&params, self.stream.cu_stream()).result().map_err(driver) }
    }
}
