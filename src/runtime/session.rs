//! Running a bundle on a GPU.
//!
//! Thread safety: a `Session` owns its stream, arena and cuBLAS handle; `run` takes
//! `&mut self`, so one session serves one thread at a time. Use one session per thread to run
//! concurrently (each has its own memory).
//!
//! CUDA graphs: the first `run` executes the steps one by one; it then captures them into a
//! CUDA graph, and every later run replays that graph with one launch (unless turned off).

use std::sync::Arc;

use cudarc::cublas::sys::{cublasOperation_t, cublasStatus_t};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use ndarray::{ArrayD, IxDyn};

use super::{nvrtc, RuntimeError};
use crate::bundle::{Bundle, IoSpec};
use crate::codegen::{GemmSpec, KernelSource, Step};
use crate::ir::{DType, Tensor};
use crate::plan::{tensor_bytes, Location};

fn driver(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Driver(format!("{e:?}"))
}

/// Whether a CUDA driver can be loaded, without panicking when there is none.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen libcuda; no driver call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

struct Launch {
    function: CudaFunction,
    config: LaunchConfig,
}

enum Loaded {
    Kernel(Launch),
    Gemm { gemm: GemmSpec, epilogue: Option<Launch> },
}

pub struct Session {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    arena: CudaSlice<u8>,
    _weights: CudaSlice<u8>,
    arena_ptr: u64,
    weights_ptr: u64,
    steps: Vec<Loaded>,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    use_graph: bool,
    graph: Option<CudaGraph>,
    runs: usize,
    /// The arch kernels were compiled for (`sm_90`).
    pub arch: String,
}

/// How a session runs.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Replay the steps as one CUDA graph after the first run.
    pub cuda_graph: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { cuda_graph: true }
    }
}

impl Session {
    /// Loads `bundle` on GPU `device`: compiles its kernels if the bundle has no PTX for this
    /// GPU, uploads the weights, allocates the arena.
    pub fn new(bundle: &Bundle, device: usize) -> Result<Session, RuntimeError> {
        Session::with_options(bundle, device, SessionOptions::default())
    }

    pub fn with_options(
        bundle: &Bundle,
        device: usize,
        options: SessionOptions,
    ) -> Result<Session, RuntimeError> {
        if !driver_available() {
            return Err(RuntimeError::NoDriver);
        }
        // SAFETY: only tries to dlopen libcublas.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(RuntimeError::NoCublas);
        }
        let ctx =
            CudaContext::new(device).map_err(|e| RuntimeError::NoDevice(format!("GPU {device}: {e:?}")))?;
        // SAFETY: the session uses one stream, and every buffer is written and read in
        // stream order, so cudarc's per-buffer events are not needed (they would also get in
        // the way of CUDA-graph capture).
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let arch = format!("sm_{major}{minor}");
        // Not the legacy default stream: that one cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(driver)?;
        let header = &bundle.header;
        let ptx_fits = header.arch.as_deref() == Some(arch.as_str());
        let mut load = |source: &KernelSource| -> Result<Launch, RuntimeError> {
            let ptx = match header.ptx.get(&source.name).filter(|_| ptx_fits) {
                Some(ptx) => ptx.clone(),
                None => nvrtc::compile_cached(source, &arch)?,
            };
            let module = ctx.load_module(Ptx::from_src(ptx)).map_err(driver)?;
            let function = module.load_function(&source.name).map_err(driver)?;
            let config = LaunchConfig {
                grid_dim: (source.grid, 1, 1),
                block_dim: (source.block, 1, 1),
                shared_mem_bytes: 0,
            };
            Ok(Launch { function, config })
        };
        let mut steps = Vec::with_capacity(header.steps.len());
        for step in &header.steps {
            steps.push(match step {
                Step::Launch(source) => Loaded::Kernel(load(source)?),
                Step::Gemm { gemm, epilogue } => {
                    Loaded::Gemm { gemm: *gemm, epilogue: epilogue.as_ref().map(&mut load).transpose()? }
                }
            });
        }
        let arena = stream.alloc_zeros::<u8>(header.arena_bytes.max(1)).map_err(driver)?;
        let weights = if bundle.weights.is_empty() {
            stream.alloc_zeros::<u8>(1).map_err(driver)?
        } else {
            stream.clone_htod(&bundle.weights).map_err(driver)?
        };
        let arena_ptr = arena.device_ptr(&stream).0;
        let weights_ptr = weights.device_ptr(&stream).0;
        let blas = CudaBlas::new(stream.clone()).map_err(driver)?;
        Ok(Session {
            stream,
            blas,
            arena,
            _weights: weights,
            arena_ptr,
            weights_ptr,
            steps,
            inputs: header.inputs.clone(),
            outputs: header.outputs.clone(),
            use_graph: options.cuda_graph,
            graph: None,
            runs: 0,
            arch,
        })
    }

    pub fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }

    fn check_inputs(&self, inputs: &[(String, Tensor)]) -> Result<(), RuntimeError> {
        let expected = || {
            self.inputs
                .iter()
                .map(|i| format!("{} {}{:?}", i.name, i.dtype, i.shape))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (name, _) in inputs {
            if !self.inputs.iter().any(|i| &i.name == name) {
                return Err(RuntimeError::Input(format!(
                    "'{name}' is not an input of the model (its inputs: {})",
                    expected()
                )));
            }
        }
        for spec in &self.inputs {
            let given = inputs.iter().find(|(n, _)| *n == spec.name).map(|(_, t)| t);
            let given = given.ok_or_else(|| {
                RuntimeError::Input(format!(
                    "input '{}' was not given (the inputs: {})",
                    spec.name,
                    expected()
                ))
            })?;
            if given.dtype().name() != spec.dtype || given.shape() != spec.shape.as_slice() {
                return Err(RuntimeError::Input(format!(
                    "input '{}' is {}{:?}, the model takes {}{:?}",
                    spec.name,
                    given.dtype(),
                    given.shape(),
                    spec.dtype,
                    spec.shape
                )));
            }
        }
        Ok(())
    }

    /// Runs the model on host tensors (by input name); returns the outputs in order.
    pub fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        self.upload(inputs)?;
        self.execute_all()?;
        self.outputs.clone().iter().map(|spec| Ok((spec.name.clone(), self.read_output(spec)?))).collect()
    }

    /// Copies host inputs to where the plan reads them (in stream order).
    pub fn upload(&mut self, inputs: &[(String, Tensor)]) -> Result<(), RuntimeError> {
        self.check_inputs(inputs)?;
        for spec in self.inputs.clone() {
            let (_, tensor) = inputs
                .iter()
                .find(|(n, _)| *n == spec.name)
                .ok_or_else(|| RuntimeError::Input(spec.name.clone()))?;
            let Location::Arena(offset) = spec.location else { continue };
            let bytes = tensor_bytes(tensor);
            let mut view = self.arena.slice_mut(offset..offset + bytes.len());
            self.stream.memcpy_htod(&bytes, &mut view).map_err(driver)?;
        }
        Ok(())
    }

    /// GPU time of `iterations` runs in milliseconds, measured with CUDA events around each
    /// run after `warmup` untimed ones; the input sets rotate (uploaded outside the timing).
    pub fn time_runs(
        &mut self,
        input_sets: &[Vec<(String, Tensor)>],
        warmup: usize,
        iterations: usize,
    ) -> Result<Vec<f64>, RuntimeError> {
        use cudarc::driver::sys::CUevent_flags;
        if input_sets.is_empty() {
            return Err(RuntimeError::Input("no input sets to time".into()));
        }
        let ctx = self.stream.context().clone();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
        let mut times = Vec::with_capacity(iterations);
        for i in 0..warmup.max(1) + iterations {
            self.upload(&input_sets[i % input_sets.len()])?;
            if self.graph.is_none() && self.use_graph {
                // The first run captures the graph; it is not timed.
                self.execute_all()?;
                continue;
            }
            start.record(&self.stream).map_err(driver)?;
            match &self.graph {
                Some(graph) => graph.launch().map_err(driver)?,
                None => self.execute()?,
            }
            end.record(&self.stream).map_err(driver)?;
            end.synchronize().map_err(driver)?;
            if i >= warmup.max(1) {
                times.push(f64::from(start.elapsed_ms(&end).map_err(driver)?));
            }
        }
        Ok(times)
    }

    /// Runs every step on the data in device memory — the first time one by one, then (with
    /// CUDA graphs on) as a captured graph — and waits for the GPU.
    pub fn execute_all(&mut self) -> Result<(), RuntimeError> {
        match &self.graph {
            Some(graph) => graph.launch().map_err(driver)?,
            None => self.execute()?,
        }
        self.stream.synchronize().map_err(driver)?;
        self.runs += 1;
        if self.use_graph && self.graph.is_none() {
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver)?;
            let recorded = self.execute();
            let graph = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver)?;
            recorded?;
            if let Some(graph) = &graph {
                graph.upload().map_err(driver)?;
            }
            self.graph = graph;
        }
        Ok(())
    }

    /// Whether later runs replay a captured CUDA graph.
    pub fn replays_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// Device address and size of input `name`, for callers that keep data on the GPU: write
    /// the input there (on any stream, finished before the next call), then `execute_all`.
    pub fn input_device_ptr(&self, name: &str) -> Option<(u64, usize)> {
        self.device_ptr(&self.inputs, name)
    }

    /// Device address and size of output `name`, valid after `execute_all` until the next run.
    pub fn output_device_ptr(&self, name: &str) -> Option<(u64, usize)> {
        self.device_ptr(&self.outputs, name)
    }

    fn device_ptr(&self, list: &[IoSpec], name: &str) -> Option<(u64, usize)> {
        let spec = list.iter().find(|s| s.name == name)?;
        Some((self.address(spec.location), spec.tensor_type()?.size_bytes()))
    }

    /// Issues every step, one by one, on the session's stream.
    fn execute(&self) -> Result<(), RuntimeError> {
        for step in &self.steps {
            match step {
                Loaded::Kernel(launch) => self.launch(launch)?,
                Loaded::Gemm { gemm, epilogue } => {
                    self.gemm(gemm)?;
                    if let Some(launch) = epilogue {
                        self.launch(launch)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn launch(&self, launch: &Launch) -> Result<(), RuntimeError> {
        let mut args = self.stream.launch_builder(&launch.function);
        args.arg(&self.arena_ptr);
        args.arg(&self.weights_ptr);
        // SAFETY: every generated kernel takes (arena, weights) device pointers and touches
        // only the offsets the plan gave it, all inside the two allocations.
        unsafe { args.launch(launch.config) }.map_err(driver)?;
        Ok(())
    }

    fn address(&self, location: Location) -> u64 {
        match location {
            Location::Arena(o) => self.arena_ptr + o as u64,
            Location::Weights(o) => self.weights_ptr + o as u64,
        }
    }

    /// Row-major `C = A·B` through column-major cuBLAS: `Cᵀ = Bᵀ·Aᵀ`, so B goes first and the
    /// roles of M and N swap. A row-major matrix read untransposed is column-major with its
    /// row length as leading dimension; a transposed one is read with the op flag.
    fn gemm(&self, g: &GemmSpec) -> Result<(), RuntimeError> {
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let ld_b = if g.b.transposed { g.k } else { g.n };
        let ld_a = if g.a.transposed { g.m } else { g.k };
        let (alpha, beta) = (g.alpha, 0.0f32);
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| RuntimeError::Driver(format!("GEMM dimension {v} is too large")))
        };
        if g.dtype != DType::F32 {
            return self.gemm_half(g, op(g.b.transposed), op(g.a.transposed), int(ld_b)?, int(ld_a)?);
        }
        // SAFETY: the pointers are inside the arena/weights allocations at offsets the plan
        // sized for these matrices; the handle is bound to this session's stream.
        let status = unsafe {
            cudarc::cublas::sys::cublasSgemmStridedBatched(
                *self.blas.handle(),
                op(g.b.transposed),
                op(g.a.transposed),
                int(g.n)?,
                int(g.m)?,
                int(g.k)?,
                &alpha,
                self.address(g.b.location) as *const f32,
                int(ld_b)?,
                g.b.batch_stride as i64,
                self.address(g.a.location) as *const f32,
                int(ld_a)?,
                g.a.batch_stride as i64,
                &beta,
                self.address(g.c) as *mut f32,
                int(g.n)?,
                (g.m * g.n) as i64,
                int(g.batch)?,
            )
        };
        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(RuntimeError::Driver(format!("cuBLAS SGEMM failed: {status:?}")));
        }
        Ok(())
    }

    /// f16/bf16 operands and result, f32 accumulation (same operand order as `gemm`).
    fn gemm_half(
        &self,
        g: &GemmSpec,
        op_b: cublasOperation_t,
        op_a: cublasOperation_t,
        ld_b: i32,
        ld_a: i32,
    ) -> Result<(), RuntimeError> {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        let ty = match g.dtype {
            DType::F16 => cudaDataType::CUDA_R_16F,
            DType::BF16 => cudaDataType::CUDA_R_16BF,
            other => return Err(RuntimeError::Driver(format!("no GEMM for {other}"))),
        };
        let (alpha, beta) = (g.alpha, 0.0f32);
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| RuntimeError::Driver(format!("GEMM dimension {v} is too large")))
        };
        // SAFETY: as in `gemm`; alpha and beta are f32 because the compute type is 32F.
        let status = unsafe {
            cudarc::cublas::sys::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                op_b,
                op_a,
                int(g.n)?,
                int(g.m)?,
                int(g.k)?,
                (&alpha as *const f32).cast(),
                self.address(g.b.location) as *const std::ffi::c_void,
                ty,
                ld_b,
                g.b.batch_stride as i64,
                self.address(g.a.location) as *const std::ffi::c_void,
                ty,
                ld_a,
                g.a.batch_stride as i64,
                (&beta as *const f32).cast(),
                self.address(g.c) as *mut std::ffi::c_void,
                ty,
                int(g.n)?,
                (g.m * g.n) as i64,
                int(g.batch)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(RuntimeError::Driver(format!("cuBLAS GemmEx ({}) failed: {status:?}", g.dtype)));
        }
        Ok(())
    }

    fn read_output(&self, spec: &IoSpec) -> Result<Tensor, RuntimeError> {
        let ty = spec
            .tensor_type()
            .ok_or_else(|| RuntimeError::Driver(format!("output '{}' has type {}", spec.name, spec.dtype)))?;
        let bytes = ty.size_bytes();
        let host = match spec.location {
            Location::Arena(o) => self.stream.clone_dtoh(&self.arena.slice(o..o + bytes)).map_err(driver)?,
            Location::Weights(o) => {
                self.stream.clone_dtoh(&self._weights.slice(o..o + bytes)).map_err(driver)?
            }
        };
        tensor_from_bytes(&host, &ty.shape, ty.dtype)
    }
}

/// A tensor from little-endian element bytes.
pub fn tensor_from_bytes(bytes: &[u8], shape: &[usize], dtype: DType) -> Result<Tensor, RuntimeError> {
    fn array<T, const N: usize>(
        bytes: &[u8],
        shape: &[usize],
        f: fn([u8; N]) -> T,
    ) -> Result<ArrayD<T>, RuntimeError> {
        let values = bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect();
        ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| RuntimeError::Driver(e.to_string()))
    }
    Ok(match dtype {
        DType::F32 => Tensor::F32(array(bytes, shape, f32::from_le_bytes)?),
        DType::F64 => Tensor::F64(array(bytes, shape, f64::from_le_bytes)?),
        DType::I64 => Tensor::I64(array(bytes, shape, i64::from_le_bytes)?),
        DType::I32 => Tensor::I32(array(bytes, shape, i32::from_le_bytes)?),
        DType::F16 => Tensor::F16(array(bytes, shape, half::f16::from_le_bytes)?),
        DType::BF16 => Tensor::BF16(array(bytes, shape, half::bf16::from_le_bytes)?),
        DType::Bool => Tensor::Bool(array(bytes, shape, |b: [u8; 1]| b[0] != 0)?),
    })
}

/// Runs `bundle` once on `inputs` on GPU `device`.
pub fn run_once(
    bundle: &Bundle,
    device: usize,
    inputs: &[(String, Tensor)],
) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    Session::new(bundle, device)?.run(inputs)
}
