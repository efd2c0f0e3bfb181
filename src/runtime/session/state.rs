//! State kept on the device between runs (a decoder's key/value cache): inputs written one
//! at a time, others left as the last run or copy left them, one output read back, and rows
//! copied from an output into an input without a trip through the host.

use cudarc::driver::{sys, CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::columns::ColumnWrite;
use super::{driver, tensor_from_bytes, RuntimeError, Session};
use crate::bundle::IoSpec;
use crate::ir::{DType, Tensor};
use crate::plan::Location;

/// PTX of `kernels/copy_rows.cu` and `kernels/argmax_rows.cu` (see kernels/README.md).
const ROW_COPY_PTX: &str = include_str!("../../../kernels/copy_rows.ptx");
const ARGMAX_PTX: &str = include_str!("../../../kernels/argmax_rows.ptx");

/// Threads a block of the copy kernel (`kernels/copy_rows.cuh`: one a word).
pub(super) const COPY_THREADS: u32 = 256;

/// The copy kernel's arguments after the ones of the kernel it may run in
/// (`copy_rows_block`'s, in order) and the blocks it takes (x: words, y: tensors and a block
/// row for the sets where there are any).
pub(super) struct RowCopyLaunch {
    sources: u64,
    targets: u64,
    rows: u64,
    words: u64,
    from_pitch: u64,
    to_pitch: u64,
    from_word: u64,
    to_word: u64,
    tensors: u64,
    /// 1 where a word is 16 bytes ([`copy_word`]), 0 where it is 4.
    wide: u64,
    sets: [ColumnWrite; 2],
    pub(super) blocks: (u32, u32),
}

impl RowCopyLaunch {
    /// Blocks a tensor (and the sets' row) of the copy at `threads` threads a block: one thread
    /// a word, and one a row of each set.
    pub(super) fn blocks_at(&self, threads: u32) -> u64 {
        let set_rows = self.sets.iter().map(|s| s.rows).max().unwrap_or(0);
        (self.rows * self.words).max(set_rows).div_ceil(u64::from(threads.max(1)))
    }

    /// Pushes the arguments, `copy_rows_block`'s order.
    pub(super) fn push<'a>(&'a self, args: &mut cudarc::driver::LaunchArgs<'a>) {
        args.arg(&self.sources).arg(&self.targets).arg(&self.rows).arg(&self.words);
        args.arg(&self.from_pitch).arg(&self.to_pitch).arg(&self.from_word).arg(&self.to_word);
        args.arg(&self.tensors).arg(&self.wide);
        args.arg(&self.sets[0]).arg(&self.sets[1]);
    }
}

/// The bytes a thread of the copy kernel moves for a copy of `words` 4-byte words a tensor:
/// 16 where every size and offset of the copy (`sizes`: the row's bytes, the offsets and
/// pitches) and every tensor's address is a multiple of 16 and the copy is of 1,024 words or
/// more (a decoder's keys and values from batch 8: a quarter of the threads), else 4 (at one
/// row, where a token took 1 µs longer with the wide words and the argmax's wide chunks
/// together; `benches/NOTES.md`, thirty-ninth session). `FUSEC_COPY_WIDE=0` keeps 4, for
/// measuring it.
fn copy_word<'a>(sizes: &[usize], words: usize, addresses: impl IntoIterator<Item = &'a u64>) -> usize {
    let whole = sizes.iter().all(|n| n % 16 == 0) && addresses.into_iter().all(|a| a % 16 == 0);
    if whole && words >= 1024 && !crate::knobs::off("FUSEC_COPY_WIDE") {
        16
    } else {
        4
    }
}

/// The kernels of this room and the device buffer of chosen ids, loaded on first use.
#[derive(Default)]
pub(super) struct StateKernels {
    row_copy: Option<CudaFunction>,
    /// The argmax kernel, and the argmax kernel with a copy beside it.
    argmax: Option<(CudaFunction, CudaFunction)>,
    /// Two words a row for the argmax kernel's blocks to merge their choices in (zero between
    /// launches: the kernel clears what it used).
    pub(super) argmax_slots: Option<CudaSlice<u64>>,
    pub(super) ids: Option<CudaSlice<i64>>,
    /// `kernels/sample_rows.cu`'s two kernels (the draw, and the draw with a copy beside it),
    /// the blocks they take a row and their threads; the device arrays of each row's draw
    /// (`sample`).
    pub(super) sample: Option<super::sample::SampleKernels>,
    pub(super) draws: Option<CudaSlice<f64>>,
    /// Room for each drawn row's token weights (`sample`).
    pub(super) weights: Option<CudaSlice<f64>>,
    /// The bases of the last copy of many tensors, and the device array holding them.
    bases: Vec<u64>,
    bases_on_device: Option<CudaSlice<u64>>,
    /// An event for ordering the session's stream with a caller's (`external`).
    event: Option<Event>,
    /// Greedy tokens fed back on the device (`feed`).
    pub(super) feed: super::feed::Feed,
    /// Whether a run was issued without waiting for it (`graph::execute_queued`) since the
    /// stream was last waited for where that matters (`io::stage_input`).
    pub(super) queued: bool,
}

/// A CUDA event (timing off), destroyed with its owner.
struct Event(sys::CUevent);

// SAFETY: a CUDA event handle may be used from any thread of the process; the session that
// owns it uses it from one thread at a time.
unsafe impl Send for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate and destroyed once, here.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.0);
        }
    }
}

impl StateKernels {
    /// The session's ordering event, created on first use (the context bound to the thread).
    pub(super) fn event(&mut self) -> Result<sys::CUevent, RuntimeError> {
        if let Some(event) = &self.event {
            return Ok(event.0);
        }
        let mut event = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: writes one event handle.
        unsafe { sys::cuEventCreate(&mut event, flags).result().map_err(driver)? };
        self.event = Some(Event(event));
        Ok(event)
    }
}

/// Rows of bytes copied from an output into an input, both on the device: `rows` rows of
/// `width` bytes, row `r` from `from_offset + r · from_pitch` of the output to
/// `to_offset + r · to_pitch` of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    pub(super) fn spec<'a>(list: &'a [IoSpec], name: &str, what: &str) -> Result<&'a IoSpec, RuntimeError> {
        list.iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
            RuntimeError::Input(format!("the model has no {what} '{name}' (it has {})", names.join(", ")))
        })
    }

    /// Input `name`, where it can be written on its own: in the arena, in a bundle of one size.
    pub(super) fn input_to_write(&self, name: &str) -> Result<&IoSpec, RuntimeError> {
        let spec = Self::spec(&self.inputs, name, "input")?;
        if !self.ranges.is_empty() {
            return Err(RuntimeError::Input(format!(
                "input '{name}': writing one input at a time needs a bundle of one size"
            )));
        }
        if !matches!(spec.location, Location::Arena(_)) {
            return Err(RuntimeError::Input(format!("input '{name}' is not in the arena")));
        }
        Ok(spec)
    }

    /// Writes input `name` from a host tensor of its type and shape, leaving the other inputs
    /// as they are (for a bundle of one size).
    pub fn write_input(&mut self, name: &str, tensor: &Tensor) -> Result<(), RuntimeError> {
        let spec = self.input_to_write(name)?;
        if tensor.dtype().name() != spec.dtype || tensor.shape() != spec.shape.as_slice() {
            return Err(RuntimeError::Input(format!(
                "input '{name}' is {}{:?}, the tensor given is {}{:?}",
                spec.dtype,
                spec.shape,
                tensor.dtype(),
                tensor.shape()
            )));
        }
        let k = self.inputs.iter().position(|s| s.name == name).unwrap_or_default();
        // Through the input's page-locked buffer, as `run` does: in stream order before the
        // next run.
        self.stage_input(k, tensor.size_bytes(), |host| crate::plan::write_tensor_bytes(host, tensor))
    }

    /// Sets every byte of input `name` to zero on the device.
    pub fn zero_input(&mut self, name: &str) -> Result<(), RuntimeError> {
        let spec = Self::spec(&self.inputs, name, "input")?;
        let bytes = spec.span_bytes();
        let ptr = self.address(spec.location);
        // SAFETY: the input's buffer of `bytes` bytes, on the session's stream.
        unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, self.stream.cu_stream()).result().map_err(driver) }
    }

    /// Output `name` of the last run copied into its page-locked buffer (waited for): the
    /// buffer's index, the output's element type and shape.
    fn stage_output(&mut self, name: &str) -> Result<(usize, DType, Vec<usize>), RuntimeError> {
        Self::spec(&self.outputs, name, "output")?;
        let k = self.outputs.iter().position(|s| s.name == name).unwrap_or_default();
        let spec = &self.outputs[k];
        let dtype = DType::from_name(&spec.dtype)
            .ok_or_else(|| RuntimeError::Driver(format!("output '{name}' has type {}", spec.dtype)))?;
        let shape = spec.shape_at(&self.point);
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        if bytes > 0 {
            let source = match spec.location {
                Location::Arena(o) => self.arena.slice(o..o + bytes),
                Location::Weights(o) => self._weights.slice(o..o + bytes),
            };
            self.stream.memcpy_dtoh(&source, &mut self.staging_out[k]).map_err(driver)?;
        }
        self.stream.synchronize().map_err(driver)?;
        self.check_indices()?;
        Ok((k, dtype, shape))
    }

    /// Output `name` of the last run, copied to the host (through its page-locked buffer).
    pub fn read_output(&mut self, name: &str) -> Result<Tensor, RuntimeError> {
        let (k, dtype, shape) = self.stage_output(name)?;
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        let host = self.staging_out[k].as_slice().map_err(driver)?;
        tensor_from_bytes(host.get(..bytes).unwrap_or_default(), &shape, dtype)
    }

    /// An f32 output of the last run into `out` (cleared first), through its page-locked
    /// buffer: no tensor is built, for what is read every step (a decoder's logits).
    pub fn read_output_f32(&mut self, name: &str, out: &mut Vec<f32>) -> Result<(), RuntimeError> {
        let (k, dtype, shape) = self.stage_output(name)?;
        if dtype != DType::F32 {
            return Err(RuntimeError::Input(format!("output '{name}' is {dtype}, not f32")));
        }
        let host = self.staging_out[k].as_slice().map_err(driver)?;
        let bytes = host.get(..shape.iter().product::<usize>() * 4).unwrap_or_default();
        out.clear();
        out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        Ok(())
    }

    /// The functions `names` of PTX `ptx`, loaded as one module.
    pub(super) fn load_kernels<const N: usize>(
        &self,
        ptx: &str,
        names: [&str; N],
    ) -> Result<[CudaFunction; N], RuntimeError> {
        let module = self.stream.context().load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(driver)?;
        let mut functions = Vec::with_capacity(N);
        for name in names {
            functions.push(module.load_function(name).map_err(driver)?);
        }
        functions.try_into().map_err(|_| RuntimeError::Driver("a kernel did not load".into()))
    }

    /// The index of the largest value of each row of f32 output `name` of the last run, seen
    /// as `rows` rows of `width` (the first of equals; NaNs never win), chosen on the GPU: only
    /// the indices come back.
    pub fn argmax_rows(&mut self, name: &str, rows: usize, width: usize) -> Result<Vec<i64>, RuntimeError> {
        self.ids_back(rows, |session, ids| session.launch_argmax(name, rows, width, (ids, None)))
    }

    /// The `rows` ids that `launch` writes at the device address it is given (the session's
    /// buffer of ids), copied back once they are written.
    pub(super) fn ids_back(
        &mut self,
        rows: usize,
        launch: impl FnOnce(&mut Self, u64) -> Result<(), RuntimeError>,
    ) -> Result<Vec<i64>, RuntimeError> {
        if self.state.ids.as_ref().is_none_or(|ids| ids.len() < rows) {
            self.state.ids = Some(self.stream.alloc_zeros::<i64>(rows.max(1)).map_err(driver)?);
        }
        let ids = self.state.ids.as_ref().map(|ids| ids.device_ptr(&self.stream).0);
        let Some(ids) = ids else { return Err(RuntimeError::Driver("no device buffer for ids".into())) };
        launch(self, ids)?;
        let mut out = vec![0i64; rows];
        if let Some(ids) = self.state.ids.as_ref() {
            self.stream.memcpy_dtoh(&ids.slice(..rows), &mut out).map_err(driver)?;
        }
        self.stream.synchronize().map_err(driver)?;
        self.check_indices()?;
        Ok(out)
    }

    /// The argmax kernel and the one that also runs a cache copy
    /// (`feed::argmax_feed_copying`), from one module loaded on first use.
    pub(super) fn argmax_kernels(&mut self) -> Result<(CudaFunction, CudaFunction), RuntimeError> {
        if self.state.argmax.is_none() {
            let [plain, copying] =
                self.load_kernels(ARGMAX_PTX, ["fusec_argmax_rows", "fusec_argmax_rows_copying"])?;
            self.state.argmax = Some((plain, copying));
        }
        self.state.argmax.clone().ok_or_else(|| RuntimeError::Driver("the argmax kernel did not load".into()))
    }

    /// The device addresses of this session's output `from` and `target`'s input `to` (the
    /// same session, or another on this GPU), where `copy` stays inside both.
    fn copy_ends(
        &self,
        target: &Session,
        from: &str,
        to: &str,
        copy: RowCopy,
    ) -> Result<(u64, u64), RuntimeError> {
        let (source, input) =
            (Self::spec(&self.outputs, from, "output")?, Self::spec(&target.inputs, to, "input")?);
        let size = |s: &IoSpec| s.span_bytes();
        let last = |offset: usize, pitch: usize| offset + (copy.rows.max(1) - 1) * pitch + copy.width;
        if copy.rows > 0
            && (last(copy.from_offset, copy.from_pitch) > size(source)
                || last(copy.to_offset, copy.to_pitch) > size(input))
        {
            return Err(RuntimeError::Input(format!(
                "a copy of rows from output '{from}' to input '{to}' runs past one of them"
            )));
        }
        Ok((self.address(source.location), target.address(input.location)))
    }

    /// Copies rows of output `from` of the last run into input `to` on the device (in stream
    /// order: before the next run reads it).
    pub fn copy_output_rows(&mut self, from: &str, to: &str, copy: RowCopy) -> Result<(), RuntimeError> {
        self.copy_output_rows_many(&[(from, to)], copy)
    }

    /// [`Session::copy_output_rows`] for several (output, input) pairs of one geometry, in
    /// one launch (a decoder's every cached key and value each step): a kernel, as the copy
    /// engines take a 2-D copy row by row, microseconds a row; a 2-D copy each only for rows
    /// not in whole 4-byte words.
    pub fn copy_output_rows_many(
        &mut self,
        pairs: &[(&str, &str)],
        copy: RowCopy,
    ) -> Result<(), RuntimeError> {
        self.copy_output_rows_setting(super::CacheCopy { pairs, copy, sets: &[] })
    }

    /// The first rows' addresses of `copy` for each (output, input) pair: in this session's
    /// outputs, and in `target`'s inputs (checked to hold the rows).
    pub(super) fn row_addresses(
        &self,
        target: &Session,
        pairs: &[(&str, &str)],
        copy: RowCopy,
    ) -> Result<(Vec<u64>, Vec<u64>), RuntimeError> {
        let mut bases = Vec::with_capacity(2 * pairs.len());
        let mut targets = Vec::with_capacity(pairs.len());
        for (from, to) in pairs {
            let (source, input) = self.copy_ends(target, from, to, copy)?;
            bases.push(source + copy.from_offset as u64);
            targets.push(input + copy.to_offset as u64);
        }
        Ok((bases, targets))
    }

    /// [`Session::copy_output_rows_many`] from this session's outputs into the inputs of
    /// `target`, another session on the same GPU (a decoder's prompt step filling the cache
    /// of its one-token step); waits for the copy, so `target`'s next run reads it.
    pub fn copy_output_rows_into(
        &mut self,
        target: &Session,
        pairs: &[(&str, &str)],
        copy: RowCopy,
    ) -> Result<(), RuntimeError> {
        let (bases, targets) = self.row_addresses(target, pairs, copy)?;
        self.copy_rows(bases, targets, copy, &[])?;
        self.stream.synchronize().map_err(driver)
    }

    /// Copies `copy.rows` rows from each address of `bases` to the address beside it in
    /// `targets` (the first rows' first bytes), on the session's stream: one launch, or a 2-D
    /// copy each for rows not in whole 4-byte words.
    pub(super) fn copy_rows(
        &mut self,
        bases: Vec<u64>,
        targets: Vec<u64>,
        copy: RowCopy,
        sets: &[ColumnWrite],
    ) -> Result<(), RuntimeError> {
        let Some(launch) = self.row_copy_launch(&bases, &targets, copy, sets)? else {
            return self.copy_rows_apart(&bases, &targets, copy, sets);
        };
        if self.state.row_copy.is_none() {
            let [copy] = self.load_kernels(ROW_COPY_PTX, ["fusec_copy_rows_many"])?;
            self.state.row_copy = Some(copy);
        }
        let function = self
            .state
            .row_copy
            .clone()
            .ok_or_else(|| RuntimeError::Driver("the copy kernel did not load".into()))?;
        let config = LaunchConfig {
            grid_dim: (launch.blocks.0, launch.blocks.1, 1),
            block_dim: (COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = self.stream.launch_builder(&function);
        launch.push(&mut args);
        // SAFETY: every tensor's rows lie inside its output's and input's buffers (checked
        // by `row_addresses`), which the session owns; the base arrays hold `n` addresses
        // each; each column write's rows lie inside its input (`column_write`).
        unsafe { args.launch(config) }.map_err(driver)?;
        Ok(())
    }

    /// [`Session::copy_rows`] without the copy kernel: a 2-D copy a tensor, a memset a set.
    pub(super) fn copy_rows_apart(
        &mut self,
        bases: &[u64],
        targets: &[u64],
        copy: RowCopy,
        sets: &[ColumnWrite],
    ) -> Result<(), RuntimeError> {
        for (&source, &target) in bases.iter().zip(targets) {
            self.copy_rows_2d(source, target, copy)?;
        }
        for set in sets {
            self.write_column(set)?;
        }
        Ok(())
    }

    /// The copy kernel's arguments for [`Session::copy_rows`] (the bases on the device), or
    /// `None` where it cannot run the copy: rows not in whole 4-byte words, nothing to copy,
    /// more than two sets. A word is 16 bytes where the geometry allows it ([`copy_word`]).
    pub(super) fn row_copy_launch(
        &mut self,
        bases: &[u64],
        targets: &[u64],
        copy: RowCopy,
        sets: &[ColumnWrite],
    ) -> Result<Option<RowCopyLaunch>, RuntimeError> {
        let n = targets.len();
        let sizes = [copy.width, copy.from_offset, copy.from_pitch, copy.to_offset, copy.to_pitch];
        let word = copy_word(&sizes, copy.rows * copy.width / 4, bases.iter().chain(targets));
        let threads = (copy.rows * copy.width / word) as u64;
        if sizes.iter().any(|n| n % 4 != 0) || threads == 0 || n == 0 || sets.len() > 2 {
            return Ok(None);
        }
        // The tensors' own addresses on the device, the first rows' offsets passed apart: a
        // decoder's cache slot moves on every step, its tensors do not, so the array is made
        // once rather than copied to the device before every step's copy.
        let (from, to) = (copy.from_offset as u64, copy.to_offset as u64);
        let all: Vec<u64> = bases.iter().map(|b| b - from).chain(targets.iter().map(|t| t - to)).collect();
        if self.state.bases != all || self.state.bases_on_device.is_none() {
            self.state.bases_on_device = Some(self.stream.clone_htod(&all).map_err(driver)?);
            self.state.bases = all;
        }
        let Some(on_device) = self.state.bases_on_device.as_ref() else {
            return Err(RuntimeError::Driver("no device array for the copy's bases".into()));
        };
        let sources = on_device.device_ptr(&self.stream).0;
        let set_rows = sets.iter().map(|s| s.rows).max().unwrap_or(0);
        let blocks = (
            u32::try_from(threads.max(set_rows).div_ceil(u64::from(COPY_THREADS)))
                .map_err(|_| RuntimeError::Input("a copy of over 2^40 words".into()))?,
            u32::try_from(n + usize::from(!sets.is_empty()))
                .map_err(|_| RuntimeError::Input(format!("{n} tensors")))?,
        );
        let none = ColumnWrite::default();
        Ok(Some(RowCopyLaunch {
            sources,
            targets: sources + 8 * n as u64,
            rows: copy.rows as u64,
            words: (copy.width / word) as u64,
            from_pitch: (copy.from_pitch / word) as u64,
            to_pitch: (copy.to_pitch / word) as u64,
            from_word: from / word as u64,
            to_word: to / word as u64,
            tensors: n as u64,
            wide: u64::from(word == 16),
            sets: [*sets.first().unwrap_or(&none), *sets.get(1).unwrap_or(&none)],
            blocks,
        }))
    }

    /// One 2-D copy of `copy.rows` rows from device address `source` (the first row's first
    /// byte) to `target`, on the session's stream.
    fn copy_rows_2d(&self, source: u64, target: u64, copy: RowCopy) -> Result<(), RuntimeError> {
        let params = copy_2d(
            (sys::CUmemorytype::CU_MEMORYTYPE_DEVICE, source, copy.from_pitch),
            (target, copy.to_pitch),
            (copy.width, copy.rows),
        );
        // SAFETY: both ends lie inside an output's and an input's buffers (`copy_ends`), which
        // the session owns; the copy is on the session's stream.
        unsafe { sys::cuMemcpy2DAsync_v2(&params, self.stream.cu_stream()).result().map_err(driver) }
    }
}

/// A 2-D copy's parameters: from (memory type, address, pitch) to device (address, pitch),
/// (bytes a row, rows).
pub(super) fn copy_2d(
    (kind, source, from_pitch): (sys::CUmemorytype, u64, usize),
    (target, to_pitch): (u64, usize),
    (width, rows): (usize, usize),
) -> sys::CUDA_MEMCPY2D {
    let host = kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST;
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: kind,
        srcHost: if host { source as *const std::ffi::c_void } else { std::ptr::null() },
        srcDevice: if host { 0 } else { source },
        srcArray: std::ptr::null_mut(),
        srcPitch: from_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: target,
        dstArray: std::ptr::null_mut(),
        dstPitch: to_pitch,
        WidthInBytes: width,
        Height: rows,
    }
}
