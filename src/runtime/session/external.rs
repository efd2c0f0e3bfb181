//! Inputs and outputs that live in the caller's memory, for embeddings of the runtime that
//! hold their own arrays (the Python package's NumPy arrays and PyTorch tensors): host inputs
//! given as bytes and outputs left in the session's page-locked buffers or on the device for
//! the caller to copy once into its own; device inputs given by address, ordered with the
//! caller's CUDA stream by events, outputs read where the session keeps them.

use cudarc::driver::sys;

use super::{driver, RuntimeError, Session};
use crate::bundle::{input_point_of, GivenInput, IoSpec};
use crate::ir::{DType, TensorType};

/// One input in host memory: its name, element type, shape and little-endian bytes.
#[derive(Clone, Copy, Debug)]
pub struct HostInput<'a> {
    /// The input's name.
    pub name: &'a str,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its elements, `shape`'s product of them, little-endian.
    pub bytes: &'a [u8],
}

/// One input in device memory (of the session's GPU): name, element type, shape and the
/// address of its first element, the elements contiguous.
#[derive(Clone, Copy, Debug)]
pub struct DeviceInput<'a> {
    /// The input's name.
    pub name: &'a str,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: &'a [usize],
    /// The device address of its first element.
    pub address: u64,
}

/// Where an output of a run on device inputs is: its type and shape, and its device address
/// (the session's buffer, valid until the next run).
#[derive(Clone, Debug)]
pub struct DeviceOutput {
    /// The output's name.
    pub name: String,
    /// Its element type and shape at the point run.
    pub ty: TensorType,
    /// The device address of its first element.
    pub address: u64,
}

impl Session {
    /// Checks `given` against the inputs and makes the session run at the point their shapes
    /// give.
    fn select_for(&mut self, given: &[GivenInput]) -> Result<(), RuntimeError> {
        let point = input_point_of(&self.inputs, &self.ranges, given).map_err(RuntimeError::Input)?;
        self.select(&point)
    }

    /// Makes the session's CUDA context current on the calling thread: for a caller that
    /// moves the session between threads (one at a time) before driving it from the new one.
    pub fn bind_to_thread(&self) -> Result<(), RuntimeError> {
        self.stream.context().bind_to_thread().map_err(driver)
    }

    /// Runs the model on host inputs given as bytes, and leaves every output in the session's
    /// page-locked buffers (waited for): read them with [`Session::staged_output`] until the
    /// next call. Returns the outputs' types, in order.
    pub fn run_host(&mut self, inputs: &[HostInput]) -> Result<Vec<TensorType>, RuntimeError> {
        self.run_host_on_device(inputs)?;
        self.copy_out()
    }

    /// Runs the model on host inputs given as bytes, and leaves every output on the device:
    /// read each with [`Session::output_pinned`] (into page-locked memory from the session's
    /// pool, for an output of 64 KiB or more) or [`Session::output_words`] (straight into new
    /// memory) until the next call. Returns the outputs' types, in order.
    pub fn run_host_on_device(&mut self, inputs: &[HostInput]) -> Result<Vec<TensorType>, RuntimeError> {
        let given: Vec<GivenInput> =
            inputs.iter().map(|i| GivenInput { name: i.name, dtype: i.dtype, shape: i.shape }).collect();
        self.select_for(&given)?;
        for input in inputs {
            let bytes = input.shape.iter().product::<usize>() * input.dtype.size_bytes();
            if input.bytes.len() != bytes {
                return Err(RuntimeError::Input(format!(
                    "input '{}' ({}{:?}) has {bytes} bytes, {} given",
                    input.name,
                    input.dtype,
                    input.shape,
                    input.bytes.len()
                )));
            }
            let k = self.inputs.iter().position(|s| s.name == input.name).unwrap_or_default();
            self.stage_input(k, bytes, |host| host.copy_from_slice(input.bytes))?;
        }
        self.execute_all()?;
        (0..self.outputs.len()).map(|k| self.output_type(k)).collect()
    }

    /// The bytes of output `k` (in the order of [`Session::outputs`]) that the last
    /// [`Session::run_host`] left in its page-locked buffer.
    pub fn staged_output(&self, k: usize) -> Result<&[u8], RuntimeError> {
        let spec = self.outputs.get(k).ok_or_else(|| RuntimeError::Input(format!("no output {k}")))?;
        let bytes = spec.shape_at(&self.point).iter().product::<usize>()
            * DType::from_name(&spec.dtype).map_or(0, |d| d.size_bytes());
        let host = self.staging_out[k].as_slice().map_err(driver)?;
        Ok(host.get(..bytes).unwrap_or_default())
    }

    /// The device address of input `name` as the session keeps it: a [`DeviceInput`] at this
    /// address is read in place, with no copy.
    pub fn input_address(&self, name: &str) -> Option<u64> {
        self.input_device_ptr(name).map(|(address, _)| address)
    }

    /// Runs the model on inputs in device memory, in order with the caller's CUDA `stream`
    /// (a `CUstream` handle of this session's GPU; 0 is the legacy default stream): the run
    /// starts after the work issued on `stream` so far, and work issued on `stream` after this
    /// call starts after the run. An input at the session's own address
    /// ([`Session::input_address`]) is read in place; any other is copied on the device into
    /// the session's buffer. The outputs stay in the session's buffers, valid until the next
    /// run. Waits for the GPU (as [`Session::execute_all`] does).
    pub fn run_device(
        &mut self,
        inputs: &[DeviceInput],
        stream: u64,
    ) -> Result<Vec<DeviceOutput>, RuntimeError> {
        let given: Vec<GivenInput> =
            inputs.iter().map(|i| GivenInput { name: i.name, dtype: i.dtype, shape: i.shape }).collect();
        self.select_for(&given)?;
        self.bind_to_thread()?;
        let caller = stream as sys::CUstream;
        self.order_after(caller)?;
        for input in inputs {
            let k = self.inputs.iter().position(|s| s.name == input.name).unwrap_or_default();
            if let Some(inside) = self.inputs[k].inside.clone() {
                // Rows into the output the input is stored in (a cache updated in place).
                let params = super::state::copy_2d(
                    (sys::CUmemorytype::CU_MEMORYTYPE_DEVICE, input.address, inside.row_bytes),
                    (self.address(self.inputs[k].location), inside.pitch_bytes),
                    (inside.row_bytes, inside.rows),
                );
                // SAFETY: the rows lie inside the output's buffer (checked at load); the caller
                // vouches for the input's bytes at its address, read after the caller's work.
                unsafe {
                    sys::cuMemcpy2DAsync_v2(&params, self.stream.cu_stream()).result().map_err(driver)?
                };
                continue;
            }
            let Some(own) = self.input_address(input.name) else { continue };
            let bytes = input.shape.iter().product::<usize>() * input.dtype.size_bytes();
            if own == input.address || bytes == 0 {
                continue;
            }
            // SAFETY: the session's input buffer holds the input at this point (its shape was
            // checked against the bundle); the caller vouches for `bytes` bytes at its address
            // on this GPU, in order on the session's stream after the caller's work.
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(own, input.address, bytes, self.stream.cu_stream())
                    .result()
                    .map_err(driver)?
            };
        }
        self.execute_all()?;
        // The caller's later work waits for the run (already finished: `execute_all` waited).
        self.record_on_own_then_wait(caller)?;
        self.outputs
            .iter()
            .map(|spec: &IoSpec| {
                let dtype = DType::from_name(&spec.dtype).ok_or_else(|| {
                    RuntimeError::Driver(format!("output '{}' has type {}", spec.name, spec.dtype))
                })?;
                Ok(DeviceOutput {
                    name: spec.name.clone(),
                    ty: TensorType::new(dtype, spec.shape_at(&self.point)),
                    address: self.address(spec.location),
                })
            })
            .collect()
    }

    /// The session's stream waits for the work issued on `caller` so far.
    fn order_after(&mut self, caller: sys::CUstream) -> Result<(), RuntimeError> {
        let event = self.state.event()?;
        // SAFETY: an event of this context recorded on the caller's stream of this GPU, and
        // the session's stream made to wait for it.
        unsafe {
            sys::cuEventRecord(event, caller).result().map_err(driver)?;
            sys::cuStreamWaitEvent(self.stream.cu_stream(), event, 0).result().map_err(driver)
        }
    }

    /// `caller` waits for the work issued on the session's stream so far.
    fn record_on_own_then_wait(&mut self, caller: sys::CUstream) -> Result<(), RuntimeError> {
        let event = self.state.event()?;
        // SAFETY: as in `order_after`, the other way round.
        unsafe {
            sys::cuEventRecord(event, self.stream.cu_stream()).result().map_err(driver)?;
            sys::cuStreamWaitEvent(caller, event, 0).result().map_err(driver)
        }
    }
}
