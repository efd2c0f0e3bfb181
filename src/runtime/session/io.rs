//! Inputs in and outputs out: host inputs staged through page-locked buffers, host outputs
//! copied from the device straight into new memory (or through page-locked buffers into
//! tensors the caller keeps), and the device addresses of inputs and outputs for callers that
//! keep data on the GPU.

use std::sync::Arc;

use cudarc::driver::{sys, CudaStream, HostSlice, PinnedHostSlice, SyncOnDrop};

use super::{driver, tensor_from_bytes, RuntimeError, Session};
use crate::bundle::IoSpec;
use crate::ir::{DType, Tensor, TensorType};
use crate::plan::Location;

impl Session {
    /// An error naming the first of `outputs` that is not the type and shape of its output.
    pub(super) fn check_outputs(&self, outputs: &[Tensor]) -> Result<(), RuntimeError> {
        if outputs.len() != self.outputs.len() {
            return Err(RuntimeError::Input(format!(
                "{} output tensors given, the model has {} ({})",
                outputs.len(),
                self.outputs.len(),
                self.outputs.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        for (spec, given) in self.outputs.iter().zip(outputs) {
            let shape = spec.shape_at(&self.point);
            if given.dtype().name() != spec.dtype || given.shape() != shape.as_slice() {
                return Err(RuntimeError::Input(format!(
                    "the tensor given for output '{}' is {}{:?}, the output is {}{:?}",
                    spec.name,
                    given.dtype(),
                    given.shape(),
                    spec.dtype,
                    shape
                )));
            }
        }
        Ok(())
    }

    /// Copies host inputs to where the plan reads them (in stream order), through the
    /// session's page-locked buffers.
    pub fn upload(&mut self, inputs: &[(String, Tensor)]) -> Result<(), RuntimeError> {
        let point = self.check_inputs(inputs)?;
        self.select(&point)?;
        for k in 0..self.inputs.len() {
            let (_, tensor) = inputs
                .iter()
                .find(|(n, _)| *n == self.inputs[k].name)
                .ok_or_else(|| RuntimeError::Input(self.inputs[k].name.clone()))?;
            self.stage_input(k, tensor.size_bytes(), |host| crate::plan::write_tensor_bytes(host, tensor))?;
        }
        Ok(())
    }

    /// Fills input `k`'s first `bytes` bytes of page-locked buffer with `fill` (after that
    /// buffer's last copy is done) and copies them to where the plan reads the input, in stream
    /// order. An input outside the arena, or of no bytes, is left alone.
    pub(super) fn stage_input(
        &mut self,
        k: usize,
        bytes: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), RuntimeError> {
        let Location::Arena(offset) = self.inputs[k].location else { return Ok(()) };
        if bytes == 0 {
            return Ok(());
        }
        // The buffer's last copy may still be queued behind a run issued without waiting
        // (`execute_queued`): the stream is waited for first (the session's context tracks
        // no events for the buffer itself). Every other path to here waited after its run.
        if self.state.queued {
            self.stream.synchronize().map_err(driver)?;
            self.state.queued = false;
        }
        let spec = &self.inputs[k];
        let target = self.address(spec.location);
        let staging = &mut self.staging_in[k];
        let host = staging.as_mut_slice().map_err(driver)?;
        let host = host.get_mut(..bytes).ok_or_else(|| {
            RuntimeError::Input(format!("input '{}' has {bytes} bytes, over its buffer", spec.name))
        })?;
        fill(host);
        if let Some(inside) = &spec.inside {
            // Rows into the output the input is stored in.
            if bytes != inside.rows * inside.row_bytes {
                return Err(RuntimeError::Input(format!(
                    "input '{}' has {bytes} bytes, not its size",
                    spec.name
                )));
            }
            // SAFETY: the copy reads the page-locked buffer on the session's stream (the
            // returned guard records that use); it writes `inside.rows` rows inside the
            // output's buffer (checked at load).
            let (host, _recorded) = unsafe { staging.stream_synced_slice(&self.stream) };
            let params = super::state::copy_2d(
                (sys::CUmemorytype::CU_MEMORYTYPE_HOST, host.as_ptr() as u64, inside.row_bytes),
                (target, inside.pitch_bytes),
                (inside.row_bytes, inside.rows),
            );
            return unsafe {
                sys::cuMemcpy2DAsync_v2(&params, self.stream.cu_stream()).result().map_err(driver)
            };
        }
        let mut view = self.arena.slice_mut(offset..offset + bytes);
        // The buffer is sized for the top of a range; the copy takes what this size fills.
        self.stream.memcpy_htod(&Prefix { inner: staging, len: bytes }, &mut view).map_err(driver)
    }

    /// Copies every output into its page-locked buffer, then waits once; returns the
    /// outputs' types.
    pub(super) fn copy_out(&mut self) -> Result<Vec<TensorType>, RuntimeError> {
        let mut types = Vec::with_capacity(self.outputs.len());
        for (spec, staging) in self.outputs.iter().zip(self.staging_out.iter_mut()) {
            let dtype = DType::from_name(&spec.dtype).ok_or_else(|| {
                RuntimeError::Driver(format!("output '{}' has type {}", spec.name, spec.dtype))
            })?;
            let ty = TensorType::new(dtype, spec.shape_at(&self.point));
            let bytes = ty.size_bytes();
            if bytes > 0 {
                let source = match spec.location {
                    Location::Arena(o) => self.arena.slice(o..o + bytes),
                    Location::Weights(o) => self._weights.slice(o..o + bytes),
                };
                self.stream.memcpy_dtoh(&source, staging).map_err(driver)?;
            }
            types.push(ty);
        }
        self.stream.synchronize().map_err(driver)?;
        self.check_indices()?;
        Ok(types)
    }

    /// The outputs, each copied from the device straight into the memory of a new tensor.
    pub(super) fn download(&mut self) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for k in 0..self.outputs.len() {
            let (ty, _) = self.output_at(k)?;
            let tensor = match ty.dtype {
                DType::F32 => Tensor::F32(self.fetch_array(k, &ty.shape)?),
                DType::F16 => Tensor::F16(self.fetch_array(k, &ty.shape)?),
                DType::BF16 => Tensor::BF16(self.fetch_array(k, &ty.shape)?),
                DType::F64 => Tensor::F64(self.fetch_array(k, &ty.shape)?),
                DType::I64 => Tensor::I64(self.fetch_array(k, &ty.shape)?),
                DType::I32 => Tensor::I32(self.fetch_array(k, &ty.shape)?),
                // Bytes 0 or 1 on the device, made booleans on the host.
                DType::Bool => {
                    let bytes: Vec<u8> = self.fetch_output(k, ty.shape.iter().product())?;
                    tensor_from_bytes(&bytes, &ty.shape, DType::Bool)?
                }
            };
            outputs.push((self.outputs[k].name.clone(), tensor));
        }
        Ok(outputs)
    }

    /// Output `k`'s type at the session's point, and its device address.
    pub(super) fn output_at(&self, k: usize) -> Result<(TensorType, u64), RuntimeError> {
        let spec = self.outputs.get(k).ok_or_else(|| RuntimeError::Input(format!("no output {k}")))?;
        let dtype = DType::from_name(&spec.dtype)
            .ok_or_else(|| RuntimeError::Driver(format!("output '{}' has type {}", spec.name, spec.dtype)))?;
        Ok((TensorType::new(dtype, spec.shape_at(&self.point)), self.address(spec.location)))
    }

    /// Copies output `k` of the last run from the device into `len` bytes at `dst`, host
    /// memory of the caller's (pageable: the driver overlaps its transfer with its copy into
    /// `dst`, where a page-locked buffer and then a copy out of it take both in turn), and
    /// returns once they are there.
    ///
    /// # Safety
    /// `dst` must be valid for `len` writes, and `len` the output's size in bytes (checked).
    pub(super) unsafe fn output_to_raw(
        &self,
        k: usize,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), RuntimeError> {
        let (ty, address) = self.output_at(k)?;
        if len != ty.size_bytes() {
            return Err(RuntimeError::Input(format!(
                "output {k} has {} bytes, {len} given for it",
                ty.size_bytes()
            )));
        }
        if len > 0 {
            // SAFETY: `len` bytes of the output's device buffer to `len` writable bytes at `dst`
            // (the caller's contract), in order after the run on the session's stream.
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), address, len, self.stream.cu_stream()) }
                .result()
                .map_err(driver)?;
            self.stream.synchronize().map_err(driver)?;
            self.check_indices()?;
        }
        Ok(())
    }

    /// Output `k` of the last run (`count` elements of `T`, its element type or bytes of the
    /// same size: a type every bit pattern of which is a value, as every numeric type is)
    /// copied from the device into a new vector.
    pub(super) fn fetch_output<T: Copy>(&self, k: usize, count: usize) -> Result<Vec<T>, RuntimeError> {
        let mut values: Vec<T> = Vec::with_capacity(count);
        let len = count * std::mem::size_of::<T>();
        // SAFETY: the vector's capacity holds `len` bytes; `output_to_raw` checks that they are
        // the output's size and writes every one of them before returning Ok.
        unsafe {
            self.output_to_raw(k, values.as_mut_ptr().cast::<u8>(), len)?;
            values.set_len(count);
        }
        Ok(values)
    }

    /// Output `k` of the last run, of shape `shape` and element type `T`, copied from the
    /// device into a new array.
    fn fetch_array<T: Copy>(&self, k: usize, shape: &[usize]) -> Result<ndarray::ArrayD<T>, RuntimeError> {
        let values = self.fetch_output(k, shape.iter().product())?;
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values)
            .map_err(|e| RuntimeError::Driver(format!("output {k}: {e}")))
    }

    /// Output `k` of the last run copied from the device into new memory of 8-byte words (so
    /// that any element type is aligned in it; the last word's bytes past the output are 0),
    /// with its length in bytes: for embeddings that hand the memory on (the Python package's
    /// NumPy arrays).
    pub fn output_words(&self, k: usize) -> Result<(Vec<u64>, usize), RuntimeError> {
        let len = self.output_at(k)?.0.size_bytes();
        let words = len.div_ceil(8);
        let mut values: Vec<u64> = Vec::with_capacity(words);
        // SAFETY: the last word is set to 0 first, then `output_to_raw` writes the first `len`
        // bytes (the capacity holds them) before returning Ok: every word is written.
        unsafe {
            if words > 0 {
                values.as_mut_ptr().add(words - 1).write(0);
            }
            self.output_to_raw(k, values.as_mut_ptr().cast::<u8>(), len)?;
            values.set_len(words);
        }
        Ok((values, len))
    }

    /// The type output `k` has at the size the session runs at.
    pub fn output_type(&self, k: usize) -> Result<TensorType, RuntimeError> {
        Ok(self.output_at(k)?.0)
    }

    /// Device address and size of input `name`, for callers that keep data on the GPU: write
    /// the input there (on any stream, finished before the next call), then `execute_all`.
    /// `None` also for an input stored inside an output (a cache updated in place), which
    /// has no buffer of its own.
    pub fn input_device_ptr(&self, name: &str) -> Option<(u64, usize)> {
        self.inputs.iter().find(|s| s.name == name).filter(|s| s.inside.is_none())?;
        self.device_ptr(&self.inputs, name)
    }

    /// Device address and size of output `name`, valid after `execute_all` until the next run.
    pub fn output_device_ptr(&self, name: &str) -> Option<(u64, usize)> {
        self.device_ptr(&self.outputs, name)
    }

    pub(super) fn device_ptr(&self, list: &[IoSpec], name: &str) -> Option<(u64, usize)> {
        let spec = list.iter().find(|s| s.name == name)?;
        Some((self.address(spec.location), spec.tensor_type()?.size_bytes()))
    }
}

/// One page-locked host buffer per input or output in `specs`, of its size (at least one byte),
/// allocated with cuMemHostAlloc `flags` (write-combined for what the host only writes).
pub(super) fn staging(
    ctx: &Arc<cudarc::driver::CudaContext>,
    specs: &[IoSpec],
    flags: u32,
) -> Result<Vec<PinnedHostSlice<u8>>, RuntimeError> {
    specs
        .iter()
        .map(|spec| {
            let bytes = spec.tensor_type().map_or(0, |t| t.size_bytes()).max(1);
            // SAFETY: page-locked host memory of `bytes` bytes; every byte a run reads from it
            // was written before (by the host, or by a copy from the device it waited for).
            unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags) }.map_err(|e| {
                RuntimeError::Driver(format!("page-locked buffer for '{}' ({bytes} bytes): {e:?}", spec.name))
            })
        })
        .collect()
}

/// The first `len` elements of a page-locked buffer, as a copy's source or destination.
pub(super) struct Prefix<'s> {
    pub(super) inner: &'s mut PinnedHostSlice<u8>,
    pub(super) len: usize,
}

impl HostSlice<u8> for Prefix<'_> {
    fn len(&self) -> usize {
        self.len.min(self.inner.len())
    }

    unsafe fn stream_synced_slice<'a>(&'a self, stream: &'a CudaStream) -> (&'a [u8], SyncOnDrop<'a>) {
        // SAFETY: as the caller's contract: the slice is used with `stream` only.
        let (slice, sync) = unsafe { self.inner.stream_synced_slice(stream) };
        (&slice[..self.len.min(slice.len())], sync)
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [u8], SyncOnDrop<'a>) {
        let len = self.len;
        // SAFETY: as the caller's contract: the slice is used with `stream` only.
        let (slice, sync) = unsafe { self.inner.stream_synced_mut_slice(stream) };
        let end = len.min(slice.len());
        (&mut slice[..end], sync)
    }
}
