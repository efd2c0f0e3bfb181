//! Running a bundle on a GPU.
//!
//! Thread safety: a `Session` owns its stream, arena and cuBLAS handle; `run` takes
//! `&mut self`, so one session serves one thread at a time. Use one session per thread to run
//! concurrently (each has its own memory).
//!
//! CUDA graphs: the first `run` executes the steps one by one; it then captures them into a
//! CUDA graph, and every later run replays that graph with one launch (unless turned off).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, HostSlice, LaunchConfig,
    PinnedHostSlice, PushKernelArg, SyncOnDrop,
};
use cudarc::nvrtc::Ptx;
use ndarray::{ArrayD, IxDyn};

use super::lt::GemmChoice;
use super::{blas, lt, nvrtc, RuntimeError};
use crate::bundle::{Bundle, IoSpec};
use crate::codegen::{GemmSpec, KernelSource, Step};
use crate::ir::{DType, Tensor, TensorType};
use crate::plan::Location;

fn driver(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Driver(format!("{e:?}"))
}

/// The CUDA version the driver supports (major, minor), or `None` where there is no driver.
pub fn driver_version() -> Option<(i32, i32)> {
    if !driver_available() {
        return None;
    }
    let mut version = 0;
    // SAFETY: writes one int; the library was just found to load.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some((version / 1000, version % 1000 / 10))
}

/// Whether a CUDA driver can be loaded, without panicking when there is none.
pub fn driver_available() -> bool {
    super::library_present(super::Library::Driver, cudarc::driver::sys::is_culib_present)
}

#[derive(Clone)]
struct Launch {
    name: String,
    function: CudaFunction,
    config: LaunchConfig,
    /// Device pointers, one per pointer parameter of the kernel; then, for a kernel of a
    /// bundle with ranges, its units of work (when bound) and the size of each range.
    args: Vec<u64>,
    /// How many of `args` are pointers.
    pointers: usize,
    /// Launched with programmatic stream serialization: the kernel waits for the one before
    /// it itself (`fusec::grid_begin`), so it may be scheduled while that one finishes.
    programmatic: bool,
    /// How the launch follows the bundle's ranges.
    scale: Option<crate::codegen::LaunchScale>,
    /// The kernel tiled for other points of the ranges, by tiling, and the sizes that choose
    /// among them ([`crate::codegen::KernelSource::variants`]).
    variants: Vec<(crate::codegen::Tiling, Launch)>,
    attention: Option<Box<crate::codegen::AttentionDims>>,
}

impl Launch {
    /// The launch at the point `values` of the bundle's ranges: of the variant tiled for it,
    /// where there is one.
    fn at(&self, values: &[usize]) -> Result<Launch, RuntimeError> {
        let tiling = self.attention.as_ref().and_then(|a| a.tiling_at(values));
        if let Some((_, variant)) = self.variants.iter().find(|(t, _)| Some(*t) == tiling) {
            let mut launch = variant.at(values)?;
            // The variants stay with the launch, for the next point.
            launch.variants = self.variants.clone();
            launch.attention = self.attention.clone();
            return Ok(launch);
        }
        let mut launch = self.clone();
        if let Some(scale) = &self.scale {
            let (units, blocks) = scale.at(values).ok_or_else(|| {
                RuntimeError::Input(format!("kernel {}: its launch at {values:?} overflows", self.name))
            })?;
            launch.config.grid_dim.0 = blocks;
            launch.args.truncate(self.pointers);
            if scale.bound {
                launch.args.push(units);
            }
            launch.args.extend(values.iter().map(|&v| v as u64));
        }
        Ok(launch)
    }
}

/// Whether a session's kernels may be launched with programmatic dependent launch on a GPU of
/// compute capability `major`: only when `FUSEC_PDL=1` asks for it, on sm_90 and later (each
/// kernel also has to start with the wait for its predecessor: [`waits_for_predecessor`]).
/// Off by default: on the H100 it made step-by-step runs (no CUDA graph) 10–25 % faster, but
/// CUDA-graph replays — how sessions run by default — no faster, and the Llama-style decoder
/// at 8×128 fp16 9 % slower (`benches/NOTES.md`).
fn programmatic_launch_wanted(major: i32) -> bool {
    major >= 9 && std::env::var("FUSEC_PDL").is_ok_and(|v| v.trim() == "1")
}

/// Whether kernel `source` begins with the wait for its predecessor (bundles written before
/// the wait was added do not).
fn waits_for_predecessor(source: &KernelSource) -> bool {
    source.source.contains("fusec::grid_begin();")
}

enum Loaded {
    Kernel(Launch),
    /// A cuBLAS or (`lt`) cuBLASLt GEMM, and its epilogue kernel unless cuBLASLt runs the
    /// epilogue inside the GEMM.
    Gemm {
        gemm: GemmSpec,
        epilogue: Option<Launch>,
        /// Runs on cuBLAS even though `lt` is prepared (a GEMM with no epilogue cuBLASLt
        /// runs, for which cuBLAS was measured faster or nothing was measured).
        on_cublas: bool,
        lt: Option<Box<lt::LtGemm>>,
    },
}

impl Loaded {
    /// What the step runs, as profiles name it.
    fn name(&self) -> String {
        match self {
            Loaded::Kernel(launch) => launch.name.clone(),
            Loaded::Gemm { gemm, epilogue, on_cublas, lt } => {
                let shape = format!("{}x{}x{}", gemm.m, gemm.n, gemm.k);
                let batch = if gemm.batch > 1 { format!(" batch {}", gemm.batch) } else { String::new() };
                let library = if lt.is_some() && !on_cublas { "cuBLASLt" } else { "cuBLAS" };
                match epilogue {
                    None if gemm.lt_epilogue.is_some() && lt.is_some() => {
                        format!("cuBLASLt gemm+bias {shape}")
                    }
                    Some(e) => format!("{library} gemm {shape}{batch} + {}", e.name),
                    None => format!("{library} gemm {shape}{batch}"),
                }
            }
        }
    }
}

/// A bundle loaded on one GPU: its kernels, weights, activation memory and stream, ready to
/// run. `run` takes `&mut self`; make one session per thread to run on several at once.
pub struct Session {
    stream: Arc<CudaStream>,
    blas: blas::Blas,
    /// Declared after `steps` would be dropped before them: steps hold cuBLASLt descriptors.
    steps: Vec<Loaded>,
    lt: Option<lt::Lt>,
    arena: CudaSlice<u8>,
    _weights: CudaSlice<u8>,
    arena_ptr: u64,
    weights_ptr: u64,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    use_graph: bool,
    graph: Option<CudaGraph>,
    runs: usize,
    /// The bundle's ranges of sizes (none for a bundle of one size).
    ranges: Vec<crate::bundle::BundleRange>,
    /// The point of the ranges `steps` and `graph` are for (the top of every range at first;
    /// empty without ranges).
    point: Vec<usize>,
    /// The steps and graph of other points run lately (the top's always), most recent last.
    sizes: Vec<(Vec<usize>, Vec<Loaded>, Option<CudaGraph>)>,
    /// How many sizes keep their steps and graph, the top's included.
    sizes_kept: usize,
    /// Whether GEMM algorithms are chosen by timing ([`SessionOptions::tune_gemms`]).
    tune: bool,
    /// Runs at the current point since it was selected, and whether its GEMMs were timed.
    point_runs: usize,
    point_tuned: bool,
    /// Points whose GEMMs were timed in this session.
    tuned: Vec<Vec<usize>>,
    /// The arch kernels were compiled for (`sm_90`).
    pub arch: String,
    /// The GPU's name as the driver reports it.
    pub device_name: String,
    /// How each distinct cuBLASLt GEMM's algorithm was chosen.
    pub gemm_choices: Vec<GemmChoice>,
    /// Page-locked host buffers, one per input and one per output, that `run` copies
    /// through: copies from and to them are asynchronous, so a run waits for the GPU once for
    /// all its outputs, rather than once per copy as copies of pageable memory do.
    staging_in: Vec<PinnedHostSlice<u8>>,
    staging_out: Vec<PinnedHostSlice<u8>>,
}

/// The middle value of `times` (0 when empty).
fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(0.0)
}

/// How many times [`Session::profile`] repeats a step in a graph to time it without launches.
pub const PROFILE_REPEAT: usize = 20;

/// Runs at a point of a bundle's ranges after which its GEMM algorithms are timed
/// ([`Session::tune_point`]); before, they are the heuristic's first (or cached) choices.
pub const TUNE_AFTER_RUNS: usize = 8;

/// Captures of a CUDA graph tried before a failure is an error ([`Session::capture`]).
const CAPTURE_TRIES: usize = 5;

/// One step's GPU time from [`Session::profile`], medians in milliseconds.
#[derive(Clone, Debug)]
pub struct StepProfile {
    /// The kernel's name, or the GEMM's description.
    pub name: String,
    /// Issued alone between two events, no graph: its launch included.
    pub alone_ms: f64,
    /// Repeated back to back in a CUDA graph, per repeat (sessions with graphs only): the
    /// step's GPU time without its launch.
    pub repeated_ms: Option<f64>,
}

/// How a session runs.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Replay the steps as one CUDA graph after the first run.
    pub cuda_graph: bool,
    /// Choose each GEMM's algorithm at load by timing the whole program (a CUDA graph) with
    /// the reference and each of the cuBLASLt heuristic's top algorithms, cached on disk;
    /// without CUDA graphs only cached choices apply. Off: GEMMs with a cuBLASLt epilogue
    /// take the heuristic's first algorithm, the others cuBLAS.
    pub tune_gemms: bool,
    /// For a bundle with a range of sizes: how many sizes keep their steps and CUDA graph
    /// (the top of the range always does); a size run again after it was dropped is set up
    /// and captured again.
    pub sizes_kept: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { cuda_graph: true, tune_gemms: true, sizes_kept: 8 }
    }
}

impl Drop for Session {
    /// The CUDA graphs go first, once the stream is idle: they refer to the kernels of the
    /// session's modules and to its memory, which the fields dropped after them unload and free.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        self.graph = None;
        self.sizes.clear();
    }
}

impl Session {
    /// Loads `bundle` on GPU `device`: compiles its kernels if the bundle has no PTX for this
    /// GPU, uploads the weights, allocates the arena.
    pub fn new(bundle: &Bundle, device: usize) -> Result<Session, RuntimeError> {
        Session::with_options(bundle, device, SessionOptions::default())
    }

    /// [`Session::new`] with the CUDA graph and GEMM timing choices of `options`.
    pub fn with_options(
        bundle: &Bundle,
        device: usize,
        options: SessionOptions,
    ) -> Result<Session, RuntimeError> {
        // The bundle first: a damaged one is the same error with or without a GPU.
        check_io(&bundle.header, bundle.weights.len())?;
        if !driver_available() {
            return Err(RuntimeError::NoDriver);
        }
        if !super::library_present(super::Library::Cublas, cudarc::cublas::sys::is_culib_present) {
            return Err(RuntimeError::NoCublas);
        }
        let ctx = super::context(device)?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let arch = format!("sm_{major}{minor}");
        let device_name = ctx.name().unwrap_or_else(|_| format!("GPU {device}"));
        // Not the legacy default stream: that one cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(driver)?;
        let header = &bundle.header;
        let ptx_fits = header.arch.as_deref() == Some(arch.as_str());
        let missing: Vec<&KernelSource> = header
            .steps
            .iter()
            .flat_map(Step::sources)
            .filter(|s| !ptx_fits || !header.ptx.contains_key(&s.function))
            .collect();
        // PTX by kernel name: the bundle's where it fits this GPU, the rest compiled now.
        let mut ptx_of =
            if missing.is_empty() { Default::default() } else { nvrtc::compile_all_cached(&missing, &arch)? };
        if ptx_fits {
            ptx_of.extend(header.ptx.iter().map(|(name, ptx)| (name.clone(), ptx.clone())));
        }
        let memory = |what: &str, needed: usize, e: cudarc::driver::DriverError| {
            out_of_memory(&ctx, &device_name, what, needed, e)
        };
        let arena_bytes = header.arena_bytes.max(1);
        let arena = stream
            .alloc_zeros::<u8>(arena_bytes)
            .map_err(|e| memory("the activation arena", arena_bytes, e))?;
        let weights = if bundle.weights.is_empty() {
            stream.alloc_zeros::<u8>(1).map_err(driver)?
        } else {
            let needed = bundle.weights.len();
            stream.clone_htod(&bundle.weights).map_err(|e| memory("the weights", needed, e))?
        };
        let arena_ptr = arena.device_ptr(&stream).0;
        let weights_ptr = weights.device_ptr(&stream).0;
        // One module per function, however many steps run it.
        let mut functions: HashMap<String, CudaFunction> = HashMap::new();
        let pdl = programmatic_launch_wanted(major);
        let top = crate::symbolic::tops(&header.ranges);
        let mut load = |source: &KernelSource| -> Result<Launch, RuntimeError> {
            let function = match functions.get(&source.function) {
                Some(f) => f.clone(),
                None => {
                    let ptx = ptx_of.get(&source.function).cloned().ok_or_else(|| {
                        RuntimeError::Driver(format!("no PTX for kernel {}", source.function))
                    })?;
                    let module = ctx.load_module(Ptx::from_src(ptx)).map_err(driver)?;
                    let f = module.load_function(&source.function).map_err(driver)?;
                    functions.insert(source.function.clone(), f.clone());
                    f
                }
            };
            let args = source
                .args
                .iter()
                .map(|&location| {
                    let inside = match location {
                        Location::Arena(o) => o < header.arena_bytes.max(1),
                        Location::Weights(o) => o < bundle.weights.len().max(1),
                    };
                    inside.then(|| device_address(location, arena_ptr, weights_ptr)).ok_or_else(|| {
                        RuntimeError::Driver(format!(
                            "kernel {}: argument {location:?} lies outside the bundle's memory",
                            source.name
                        ))
                    })
                })
                .collect::<Result<Vec<u64>, _>>()?;
            let config = LaunchConfig {
                grid_dim: (source.grid, 1, 1),
                block_dim: (source.block, 1, 1),
                shared_mem_bytes: 0,
            };
            let programmatic = pdl && waits_for_predecessor(source);
            let pointers = args.len();
            Ok(Launch {
                name: source.name.clone(),
                function,
                config,
                args,
                pointers,
                programmatic,
                scale: source.scale.clone(),
                variants: Vec::new(),
                attention: None,
            })
        };
        // cuBLASLt (a handle and its workspace) for the GEMMs whose epilogue it runs, and for
        // every single GEMM when their algorithms may be chosen by timing.
        let wants_lt = header.steps.iter().any(|s| {
            matches!(s, Step::Gemm { gemm, .. }
                if gemm.lt_epilogue.is_some() || (options.tune_gemms && gemm.batch == 1))
        });
        let lt = if wants_lt { lt::Lt::new(device, &stream)? } else { None };
        let blas = blas::Blas::new(device, &stream)?;
        // Algorithms are chosen by timing the program as a CUDA graph. Without graphs (the
        // unfused baseline) nothing is timed: choices already cached apply, and every other
        // GEMM keeps its reference (cuBLAS, or cuBLASLt's first algorithm where cuBLASLt runs
        // the epilogue), so a session with and one without graphs compute alike.
        let tune = options.tune_gemms && lt.is_some();
        let mut steps = Vec::with_capacity(header.steps.len());
        for step in &header.steps {
            steps.push(match step {
                Step::Launch(source) => {
                    let mut launch = load(source)?;
                    for variant in &source.variants {
                        let tiling = variant.tiling.ok_or_else(|| {
                            RuntimeError::Driver(format!(
                                "kernel {}: a variant without its tiling",
                                source.name
                            ))
                        })?;
                        launch.variants.push((tiling, load(variant)?));
                    }
                    launch.attention = source.attention.clone();
                    Loaded::Kernel(launch.at(&top)?)
                }
                Step::Gemm { gemm, epilogue } => {
                    let bias = gemm.lt_epilogue.map(|e| device_address(e.bias, arena_ptr, weights_ptr));
                    let plain = gemm.lt_epilogue.is_none();
                    let prepared = lt
                        .as_ref()
                        .filter(|_| tune || !plain)
                        .and_then(|lt| lt.prepare(gemm, bias))
                        .map(Box::new);
                    // With cuBLASLt running the epilogue, the kernel is not needed.
                    let epilogue = match (&prepared, plain) {
                        (Some(_), false) => None,
                        _ => epilogue.as_ref().map(|e| load(e)?.at(&top)).transpose()?,
                    };
                    Loaded::Gemm { gemm: gemm.clone(), epilogue, on_cublas: plain, lt: prepared }
                }
            });
        }
        stream.synchronize().map_err(driver)?;
        let mut session = Session {
            stream,
            blas,
            steps,
            lt,
            arena,
            _weights: weights,
            arena_ptr,
            weights_ptr,
            inputs: header.inputs.clone(),
            outputs: header.outputs.clone(),
            use_graph: options.cuda_graph,
            graph: None,
            runs: 0,
            ranges: header.ranges.clone(),
            point: top.clone(),
            sizes: Vec::new(),
            sizes_kept: options.sizes_kept.max(1),
            tune: tune && options.cuda_graph,
            point_runs: 0,
            point_tuned: true,
            tuned: Vec::new(),
            arch,
            device_name,
            gemm_choices: Vec::new(),
            staging_in: staging(&ctx, &header.inputs, sys::CU_MEMHOSTALLOC_WRITECOMBINED)?,
            staging_out: staging(&ctx, &header.outputs, 0)?,
        };
        if tune {
            let _one_at_a_time = lt::TUNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut cache = lt::AlgoCache::open(nvrtc::cache_dir(), &session.device_name);
            session.gemm_choices = session.tune_gemms(&mut cache, options.cuda_graph)?;
            cache.save();
        }
        Ok(session)
    }

    /// The bundle's inputs: names, element types and shapes, in order.
    pub fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }

    /// The bundle's outputs, in the order `run` returns them.
    pub fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }

    /// Checks the inputs against the bundle's ([`crate::bundle::input_point`]); returns the
    /// point of the ranges they are at (empty for a bundle without ranges).
    fn check_inputs(&self, inputs: &[(String, Tensor)]) -> Result<Vec<usize>, RuntimeError> {
        crate::bundle::input_point(&self.inputs, &self.ranges, inputs).map_err(RuntimeError::Input)
    }

    /// The size of the bundle's one range the session runs at (the top of the range until
    /// inputs of another size are given; 0 for a bundle without ranges); for a bundle with
    /// several ranges, the first's ([`Session::point`] has them all).
    pub fn size(&self) -> usize {
        self.point.first().copied().unwrap_or(0)
    }

    /// The point of the bundle's ranges the session runs at: the size of each range, in the
    /// order of [`crate::bundle::Header::ranges`] (empty without ranges).
    pub fn point(&self) -> &[usize] {
        &self.point
    }

    /// [`Session::select`] for a bundle with one range.
    pub fn select_size(&mut self, n: usize) -> Result<(), RuntimeError> {
        if self.ranges.len() > 1 {
            return Err(RuntimeError::Input(format!(
                "the bundle has {} ranges ({}): select a point of all of them",
                self.ranges.len(),
                self.ranges.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        if self.ranges.is_empty() {
            return if n == 0 {
                Ok(())
            } else {
                Err(RuntimeError::Input(format!("the bundle runs one size, not a range (asked for {n})")))
            };
        }
        self.select(&[n])
    }

    /// Makes the session run at the point `values` of the bundle's ranges (the size of each,
    /// in order): the steps and CUDA graph of that point, set up on its first use (GEMM
    /// descriptors; the graph is captured on its first run) and kept for the
    /// [`SessionOptions::sizes_kept`] points used last. `run` does this from its inputs'
    /// shapes; callers that write inputs in device memory (`input_device_ptr`) call it
    /// themselves.
    pub fn select(&mut self, values: &[usize]) -> Result<(), RuntimeError> {
        if values == self.point.as_slice() {
            return Ok(());
        }
        if values.len() != self.ranges.len() {
            return Err(RuntimeError::Input(format!(
                "{} sizes given for the bundle's {} ranges",
                values.len(),
                self.ranges.len()
            )));
        }
        for (range, &n) in self.ranges.iter().zip(values) {
            if n < range.low || n > range.high {
                return Err(RuntimeError::Input(format!(
                    "{}={n} is outside the bundle's range {}..{}",
                    range.symbol, range.low, range.high
                )));
            }
        }
        let top = crate::symbolic::tops(&self.ranges);
        // The graphs of the steps parked or dropped here refer to this stream's work.
        self.stream.synchronize().map_err(driver)?;
        let steps = std::mem::take(&mut self.steps);
        let graph = self.graph.take();
        self.sizes.push((std::mem::take(&mut self.point), steps, graph));
        let (steps, graph) = match self.sizes.iter().position(|(s, _, _)| s.as_slice() == values) {
            Some(i) => {
                let (_, steps, graph) = self.sizes.remove(i);
                (steps, graph)
            }
            None => {
                let steps = self.sizes.iter().find(|(s, _, _)| *s == top).map(|(_, steps, _)| steps);
                let steps =
                    steps.ok_or_else(|| RuntimeError::Driver("the top size's steps are missing".into()))?;
                (self.steps_at(steps, values)?, None)
            }
        };
        self.steps = steps;
        self.graph = graph;
        self.point = values.to_vec();
        self.point_runs = 0;
        self.point_tuned = values == top.as_slice() || self.tuned.iter().any(|t| t == values);
        // Least recently used first; the top of the ranges stays.
        while self.sizes.len() + 1 > self.sizes_kept.max(2) {
            let Some(i) = self.sizes.iter().position(|(s, _, _)| *s != top) else { break };
            drop(self.sizes.remove(i));
        }
        Ok(())
    }

    /// The steps at the point `values` of the bundle's ranges, from the top's: launches
    /// scaled, GEMMs at their sizes (cuBLASLt's heuristic choice where it runs an epilogue,
    /// cuBLAS for the others: algorithm timing is for the top).
    fn steps_at(&self, top: &[Loaded], values: &[usize]) -> Result<Vec<Loaded>, RuntimeError> {
        // GEMM algorithms timed before at these shapes, on this GPU ([`Session::tune_point`]).
        let cache = self.tune.then(|| lt::AlgoCache::open(nvrtc::cache_dir(), &self.device_name));
        top.iter()
            .map(|step| {
                Ok(match step {
                    Loaded::Kernel(launch) => Loaded::Kernel(launch.at(values)?),
                    Loaded::Gemm { gemm, epilogue, lt, .. } => {
                        let gemm = gemm.at(values).ok_or_else(|| {
                            RuntimeError::Input(format!("a GEMM's sizes at {values:?} overflow"))
                        })?;
                        let epilogue = epilogue.as_ref().map(|l| l.at(values)).transpose()?;
                        let cached = cache.as_ref().and_then(|c| c.get(&lt::gemm_key(&gemm)));
                        let mut prepared = match (lt, gemm.lt_epilogue) {
                            // A plain GEMM whose algorithm was timed at this size before (by
                            // this bundle at this point, or another at that shape): cuBLASLt's.
                            (Some(_), None) if cached.is_some_and(|c| !c.choice.cublas()) => {
                                self.lt.as_ref().and_then(|l| l.prepare_first(&gemm, None)).map(Box::new)
                            }
                            (Some(_), Some(e)) => {
                                let lt = self
                                    .lt
                                    .as_ref()
                                    .ok_or_else(|| RuntimeError::Driver("no cuBLASLt handle".into()))?;
                                let prepared =
                                    lt.prepare_first(&gemm, Some(self.address(e.bias))).ok_or_else(|| {
                                        RuntimeError::Driver(format!(
                                        "cuBLASLt has no algorithm for the {}x{}x{} GEMM with its epilogue",
                                        gemm.m, gemm.n, gemm.k
                                    ))
                                    })?;
                                Some(Box::new(prepared))
                            }
                            _ => None,
                        };
                        if let (Some(p), Some(c), Some(l)) = (prepared.as_mut(), cached, self.lt.as_ref()) {
                            if !l.restore(p, c) {
                                tracing::debug!(
                                    "a cached GEMM algorithm does not fit {}",
                                    lt::gemm_key(&gemm)
                                );
                            }
                        }
                        Loaded::Gemm { gemm, epilogue, on_cublas: prepared.is_none(), lt: prepared }
                    }
                })
            })
            .collect()
    }

    /// Runs the model on host tensors (by input name); returns the outputs in order.
    pub fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        self.upload(inputs)?;
        self.execute_all()?;
        self.download()
    }

    /// Runs the model and writes its outputs into `outputs` (in the order of
    /// [`Session::outputs`], each of that output's type and shape), allocating nothing: a
    /// serving loop keeps one set of output tensors and reuses it. `outputs` from an earlier
    /// [`Session::run`] fit.
    pub fn run_into(
        &mut self,
        inputs: &[(String, Tensor)],
        outputs: &mut [Tensor],
    ) -> Result<(), RuntimeError> {
        self.upload(inputs)?;
        self.check_outputs(outputs)?;
        self.execute_all()?;
        self.copy_out()?;
        for (staging, tensor) in self.staging_out.iter().zip(outputs.iter_mut()) {
            let bytes = tensor.size_bytes();
            let host = staging.as_slice().map_err(driver)?;
            crate::plan::read_tensor_bytes(host.get(..bytes).unwrap_or_default(), tensor);
        }
        Ok(())
    }

    /// An error naming the first of `outputs` that is not the type and shape of its output.
    fn check_outputs(&self, outputs: &[Tensor]) -> Result<(), RuntimeError> {
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
        for (spec, staging) in self.inputs.iter().zip(self.staging_in.iter_mut()) {
            let (_, tensor) = inputs
                .iter()
                .find(|(n, _)| *n == spec.name)
                .ok_or_else(|| RuntimeError::Input(spec.name.clone()))?;
            let Location::Arena(offset) = spec.location else { continue };
            let bytes = tensor.size_bytes();
            if bytes == 0 {
                continue;
            }
            // Waits for the buffer's last copy (the previous run's) before writing it.
            let host = staging.as_mut_slice().map_err(driver)?;
            let host = host.get_mut(..bytes).ok_or_else(|| {
                RuntimeError::Input(format!("input '{}' has {bytes} bytes, over its buffer", spec.name))
            })?;
            crate::plan::write_tensor_bytes(host, tensor);
            let mut view = self.arena.slice_mut(offset..offset + bytes);
            // The buffer is sized for the top of a range; the copy takes what this size fills.
            self.stream.memcpy_htod(&Prefix { inner: staging, len: bytes }, &mut view).map_err(driver)?;
        }
        Ok(())
    }

    /// Copies every output into its page-locked buffer, then waits once; returns the
    /// outputs' types.
    fn copy_out(&mut self) -> Result<Vec<TensorType>, RuntimeError> {
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
        Ok(types)
    }

    /// The outputs, copied to the host through the session's page-locked buffers: every copy
    /// issued, then one wait.
    fn download(&mut self) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        let types = self.copy_out()?;
        self.outputs
            .iter()
            .zip(&self.staging_out)
            .zip(types)
            .map(|((spec, staging), ty)| {
                let host = staging.as_slice().map_err(driver)?;
                let host = host.get(..ty.size_bytes()).unwrap_or_default();
                Ok((spec.name.clone(), tensor_from_bytes(host, &ty.shape, ty.dtype)?))
            })
            .collect()
    }

    /// GPU time of `iterations` runs in milliseconds, measured with CUDA events around each
    /// run after `warmup` untimed ones; the input sets rotate (uploaded outside the timing).
    pub fn time_runs(
        &mut self,
        input_sets: &[Vec<(String, Tensor)>],
        warmup: usize,
        iterations: usize,
    ) -> Result<Vec<f64>, RuntimeError> {
        if input_sets.is_empty() {
            return Err(RuntimeError::Input("no input sets to time".into()));
        }
        let events = self.timing_events(2)?;
        let (start, end) = (&events[0], &events[1]);
        let mut times = Vec::with_capacity(iterations);
        for i in 0..warmup.max(1) + iterations {
            if i < input_sets.len() || input_sets.len() > 1 {
                self.upload(&input_sets[i % input_sets.len()])?;
            }
            if self.graph.is_none() && self.use_graph {
                // The first run captures the graph; it is not timed.
                self.execute_all()?;
                continue;
            }
            let ms = self.timed_run(start, end)?;
            if i >= warmup.max(1) {
                times.push(ms);
            }
        }
        Ok(times)
    }

    /// Runs every step on the data in device memory — the first time one by one, then (with
    /// CUDA graphs on) as a captured graph — and waits for the GPU.
    pub fn execute_all(&mut self) -> Result<(), RuntimeError> {
        // A size of a range first run after the session's first run (its kernels loaded): its
        // graph is captured straight away and launched, without a run step by step first. If
        // the capture fails, the run goes step by step and captures after, as a first run does.
        if self.use_graph && self.graph.is_none() && self.runs > 0 && !self.ranges.is_empty() {
            match self.capture(|session| session.execute()) {
                Ok(graph) => {
                    graph.upload().map_err(driver)?;
                    self.graph = Some(graph);
                }
                Err(e) => tracing::debug!("capturing {:?} before its first run failed: {e}", self.point),
            }
        }
        match &self.graph {
            Some(graph) => graph.launch().map_err(driver)?,
            None => self.execute()?,
        }
        self.stream.synchronize().map_err(driver)?;
        self.runs += 1;
        self.point_runs += 1;
        if !self.point_tuned && self.point_runs >= TUNE_AFTER_RUNS {
            self.tune_point()?;
            // The timing left the outputs of the last candidate timed: this run's are those of
            // the algorithms chosen, as the next runs' will be.
            self.execute_all()?;
        }
        if self.use_graph && self.graph.is_none() {
            let graph = self.capture(|session| session.execute())?;
            graph.upload().map_err(driver)?;
            self.graph = Some(graph);
        }
        Ok(())
    }

    /// The CUDA graph of what `record` launches on the session's stream. Another thread's
    /// call can invalidate a capture in flight (a module unloaded, a context synchronized, by
    /// another session or by the program embedding this one): the capture is then made
    /// again, up to [`CAPTURE_TRIES`] times, before its error is returned.
    fn capture(&self, record: impl Fn(&Self) -> Result<(), RuntimeError>) -> Result<CudaGraph, RuntimeError> {
        let mut tries = 0;
        loop {
            tries += 1;
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver)?;
            let recorded = record(self);
            let captured = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver);
            let failure = match (recorded, captured) {
                (Ok(()), Ok(Some(graph))) => return Ok(graph),
                (Ok(()), Ok(None)) => RuntimeError::Driver("the capture gave no graph".into()),
                (Err(e), _) | (_, Err(e)) => e,
            };
            if tries >= CAPTURE_TRIES {
                return Err(failure);
            }
            tracing::warn!(
                "CUDA graph capture failed (try {tries} of {CAPTURE_TRIES}), trying again: {failure}"
            );
            self.stream.synchronize().map_err(driver)?;
            std::thread::sleep(std::time::Duration::from_millis(tries as u64));
        }
    }

    /// Kernel launches and library calls per run as loaded (a GEMM whose epilogue cuBLASLt
    /// could not take runs as two).
    pub fn launches(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Loaded::Kernel(_) => 1,
                Loaded::Gemm { epilogue, .. } => 1 + usize::from(epilogue.is_some()),
            })
            .sum()
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
            self.execute_step(step)?;
        }
        Ok(())
    }

    /// GPU time of each step (a kernel, or a GEMM with its epilogue) on `inputs`, median of
    /// `iterations` runs after one warm-up, in program order. Each step is timed two ways:
    /// alone (issued step by step with CUDA events between the steps, no graph: its launch
    /// included) and, where the session uses CUDA graphs, repeated back to back in a graph
    /// (its GPU time without the launch; see `profile_repeated`). Event record nodes between
    /// the steps of the program's graph were tried: each added ~2.5 µs to every step.
    pub fn profile(
        &mut self,
        inputs: &[(String, Tensor)],
        iterations: usize,
    ) -> Result<Vec<StepProfile>, RuntimeError> {
        self.upload(inputs)?;
        let events = self.timing_events(self.steps.len() + 1)?;
        let mut times = vec![Vec::with_capacity(iterations); self.steps.len()];
        // The first pass warms up.
        for i in 0..iterations + 1 {
            events[0].record(&self.stream).map_err(driver)?;
            for (s, step) in self.steps.iter().enumerate() {
                self.execute_step(step)?;
                events[s + 1].record(&self.stream).map_err(driver)?;
            }
            self.stream.synchronize().map_err(driver)?;
            for (s, t) in times.iter_mut().enumerate().filter(|_| i > 0) {
                t.push(f64::from(events[s].elapsed_ms(&events[s + 1]).map_err(driver)?));
            }
        }
        let repeated = match self.use_graph {
            true => Some(self.profile_repeated(iterations)?),
            false => None,
        };
        Ok(self
            .steps
            .iter()
            .zip(times)
            .enumerate()
            .map(|(s, (step, t))| StepProfile {
                name: step.name(),
                alone_ms: median(t),
                repeated_ms: repeated.as_ref().map(|r| r[s]),
            })
            .collect())
    }

    /// `count` events that record timing.
    fn timing_events(&self, count: usize) -> Result<Vec<CudaEvent>, RuntimeError> {
        use cudarc::driver::sys::CUevent_flags;
        let ctx = self.stream.context().clone();
        (0..count)
            .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(driver)
    }

    /// Each step's GPU time without its launch: the step captured [`PROFILE_REPEAT`] times back
    /// to back in a CUDA graph, the graph's median time over `iterations` replays (after one)
    /// divided by the repeat count. Inputs are warm in L2, as in the program, where each
    /// step's inputs were just written; a GEMM's weights are too, unlike in the program.
    fn profile_repeated(&mut self, iterations: usize) -> Result<Vec<f64>, RuntimeError> {
        let events = self.timing_events(2)?;
        let mut times = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let graph =
                self.capture(|session| (0..PROFILE_REPEAT).try_for_each(|_| session.execute_step(step)))?;
            let mut runs = Vec::with_capacity(iterations);
            for i in 0..iterations + 1 {
                events[0].record(&self.stream).map_err(driver)?;
                graph.launch().map_err(driver)?;
                events[1].record(&self.stream).map_err(driver)?;
                let ms = f64::from(events[0].elapsed_ms(&events[1]).map_err(driver)?);
                if i > 0 {
                    runs.push(ms / PROFILE_REPEAT as f64);
                }
            }
            times.push(median(runs));
        }
        Ok(times)
    }

    /// Times the GEMM algorithms of the current point of the ranges (one that has run
    /// [`TUNE_AFTER_RUNS`] times), as a session does at the top when it loads: each GEMM
    /// prepared with the heuristic's candidates, the program timed with each, the choices
    /// cached on disk (a point set up later, in this session or another, takes them at once).
    fn tune_point(&mut self) -> Result<(), RuntimeError> {
        self.point_tuned = true;
        self.tuned.push(self.point.clone());
        let Some(lt) = self.lt.as_ref() else { return Ok(()) };
        let mut prepared = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            if let Loaded::Gemm { gemm, .. } = step {
                let bias = gemm.lt_epilogue.map(|e| self.address(e.bias));
                prepared.push((i, lt.prepare(gemm, bias).map(Box::new)));
            }
        }
        for (i, p) in prepared {
            if let (Some(Loaded::Gemm { lt, on_cublas, gemm, .. }), Some(p)) = (self.steps.get_mut(i), p) {
                // A plain GEMM starts on cuBLAS, the reference it is timed against.
                *on_cublas = gemm.lt_epilogue.is_none();
                *lt = Some(p);
            }
        }
        let _one_at_a_time = lt::TUNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut cache = lt::AlgoCache::open(nvrtc::cache_dir(), &self.device_name);
        let runs = self.runs;
        let choices = self.tune_gemms(&mut cache, true)?;
        cache.save();
        self.runs = runs;
        tracing::debug!("GEMMs at {:?} timed: {} choices", self.point, choices.len());
        Ok(())
    }

    /// Chooses each distinct GEMM's algorithm by timing the whole program (a CUDA graph) with
    /// each candidate in turn — the reference (cuBLAS for a GEMM with no epilogue cuBLASLt
    /// runs, else cuBLASLt's first algorithm), then the heuristic's others — and keeping one
    /// only when it makes the program faster by more than the noise margin. A GEMM alone,
    /// called back to back, is a poor guide: in a model its weights come from HBM and its
    /// neighbours share the GPU. Choices in `cache` are applied without timing; without
    /// `time`, only they are.
    fn tune_gemms(&mut self, cache: &mut lt::AlgoCache, time: bool) -> Result<Vec<GemmChoice>, RuntimeError> {
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            if let Loaded::Gemm { gemm, lt: Some(_), .. } = step {
                let key = lt::gemm_key(gemm);
                match groups.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((key, vec![i])),
                }
            }
        }
        let mut choices = Vec::new();
        let mut untimed = Vec::new();
        for (key, members) in groups {
            match cache.get(&key).cloned() {
                Some(cached) if self.restore(&members, &cached) => {
                    choices.push(GemmChoice {
                        cached: true,
                        config: self.gemm_config(members[0]),
                        ..cached.choice
                    });
                }
                _ => untimed.push((key, members)),
            }
        }
        if untimed.is_empty() || !time {
            return Ok(choices);
        }
        let mut best = self.time_program()?;
        for (key, members) in untimed {
            let Some(Loaded::Gemm { gemm, lt: Some(prepared), .. }) = self.steps.get(members[0]) else {
                continue;
            };
            let plain = gemm.lt_epilogue.is_none();
            // `None`: cuBLAS; `Some(r)`: the heuristic's algorithm of rank `r`.
            let options: Vec<Option<usize>> = plain
                .then_some(None)
                .into_iter()
                .chain((0..lt::Lt::candidates(prepared)).map(Some))
                .collect();
            let heuristic = lt::Lt::heuristic(prepared);
            let reference_ms = best;
            let mut kept = 0;
            for (i, &option) in options.iter().enumerate().skip(1) {
                self.apply(&members, option);
                let ms = self.time_program()?;
                tracing::debug!(gemm = %key, candidate = i, config = %self.gemm_config(members[0]), ms, "GEMM candidate timed");
                if ms < lt::MARGIN * best {
                    best = ms;
                    kept = i;
                }
            }
            self.apply(&members, options[kept]);
            let choice = GemmChoice {
                gemm: key.clone(),
                reference: if plain { lt::Reference::Cublas } else { lt::Reference::HeuristicFirst },
                candidates: options.len(),
                heuristic: usize::from(plain) + heuristic,
                chosen: kept,
                first_us: 1e3 * reference_ms,
                chosen_us: 1e3 * best,
                cached: false,
                config: self.gemm_config(members[0]),
            };
            if let Some(Loaded::Gemm { lt: Some(prepared), .. }) = self.steps.get(members[0]) {
                cache.insert(key, lt::CachedAlgo::new(prepared, choice.clone()));
            }
            choices.push(choice);
        }
        // The next run captures the graph of the chosen algorithms.
        self.graph = None;
        self.runs = 0;
        Ok(choices)
    }

    /// The configuration GEMM step `i` runs with: `cuBLAS`, or its cuBLASLt algorithm's.
    fn gemm_config(&self, i: usize) -> String {
        match self.steps.get(i) {
            Some(Loaded::Gemm { on_cublas: true, .. }) => "cuBLAS".to_string(),
            Some(Loaded::Gemm { lt: Some(prepared), .. }) => lt::Lt::config(prepared),
            _ => String::new(),
        }
    }

    /// Runs the GEMM steps `members` on cuBLAS (`None`) or on the cuBLASLt heuristic's
    /// algorithm of rank `r` (`Some(r)`).
    fn apply(&mut self, members: &[usize], option: Option<usize>) {
        for &i in members {
            if let Some(Loaded::Gemm { lt: Some(prepared), on_cublas, .. }) = self.steps.get_mut(i) {
                *on_cublas = option.is_none();
                if let Some(rank) = option {
                    lt::Lt::select(prepared, rank);
                }
            }
        }
    }

    /// Applies a cached choice to `members`; false when it no longer fits.
    fn restore(&mut self, members: &[usize], cached: &lt::CachedAlgo) -> bool {
        let Some(lt) = self.lt.as_ref() else { return false };
        for &i in members {
            if let Some(Loaded::Gemm { lt: Some(prepared), on_cublas, .. }) = self.steps.get_mut(i) {
                *on_cublas = cached.choice.cublas();
                if !*on_cublas && !lt.restore(prepared, cached) {
                    return false;
                }
            }
        }
        true
    }

    /// One run (the graph's replay, or the steps one by one) between `start` and `end`, in
    /// milliseconds, waited for.
    fn timed_run(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64, RuntimeError> {
        start.record(&self.stream).map_err(driver)?;
        match &self.graph {
            Some(graph) => graph.launch().map_err(driver)?,
            None => self.execute()?,
        }
        end.record(&self.stream).map_err(driver)?;
        end.synchronize().map_err(driver)?;
        Ok(f64::from(start.elapsed_ms(end).map_err(driver)?))
    }

    /// Median milliseconds of the program as a CUDA graph (captured anew), over
    /// `lt::TIMED_RUNS` replays after three untimed ones.
    fn time_program(&mut self) -> Result<f64, RuntimeError> {
        self.graph = None;
        self.execute_all()?;
        let events = self.timing_events(2)?;
        let mut times = Vec::with_capacity(lt::TIMED_RUNS);
        for i in 0..3 + lt::TIMED_RUNS {
            let ms = self.timed_run(&events[0], &events[1])?;
            if i >= 3 {
                times.push(ms);
            }
        }
        Ok(median(times))
    }

    fn execute_step(&self, step: &Loaded) -> Result<(), RuntimeError> {
        {
            match step {
                Loaded::Kernel(launch) => self.launch(launch)?,
                Loaded::Gemm { gemm, epilogue, lt: Some(prepared), on_cublas: false } => {
                    let lt =
                        self.lt.as_ref().ok_or_else(|| RuntimeError::Driver("no cuBLASLt handle".into()))?;
                    let addresses =
                        (self.address(gemm.a.location), self.address(gemm.b.location), self.address(gemm.c));
                    lt.run(prepared, gemm, addresses, &self.stream)?;
                    if let Some(launch) = epilogue {
                        self.launch(launch)?;
                    }
                }
                Loaded::Gemm { gemm, epilogue, .. } => {
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
        if launch.programmatic {
            return self.launch_programmatic(launch);
        }
        let mut args = self.stream.launch_builder(&launch.function);
        for pointer in &launch.args {
            args.arg(pointer);
        }
        // SAFETY: every generated kernel takes one device pointer per buffer it touches,
        // each checked at load to start inside the arena or the weights, and touches only
        // the bytes the plan gave that buffer.
        unsafe { args.launch(launch.config) }.map_err(|e| launch_failed(launch, e))?;
        Ok(())
    }

    /// [`Session::launch`] through `cuLaunchKernelEx` with programmatic stream serialization
    /// allowed (captured into the graph as a programmatic edge).
    fn launch_programmatic(&self, launch: &Launch) -> Result<(), RuntimeError> {
        use cudarc::driver::sys;
        // SAFETY: a plain C struct (an id and a union of plain values); zero is valid.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let (grid, block) = (launch.config.grid_dim, launch.config.block_dim);
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: launch.config.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: 1,
        };
        let mut params: Vec<*mut std::ffi::c_void> =
            launch.args.iter().map(|a| (a as *const u64).cast_mut().cast()).collect();
        // SAFETY: as in `launch`: one device pointer per kernel parameter, each inside the
        // session's memory; `params` points at them and outlives the call, which copies them.
        // The kernel begins with `fusec::grid_begin`, so it touches no memory before the
        // kernel before it has completed.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                launch.function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| launch_failed(launch, e))
    }

    fn address(&self, location: Location) -> u64 {
        device_address(location, self.arena_ptr, self.weights_ptr)
    }

    fn gemm(&self, g: &GemmSpec) -> Result<(), RuntimeError> {
        let addresses = (self.address(g.a.location), self.address(g.b.location), self.address(g.c));
        blas::gemm(self.blas.handle()?, g, addresses)
    }
}

/// Every input and output of the bundle lies inside its memory (the arena, or for an output
/// the weights), with a size that fits in memory: a damaged or hostile header is an error
/// here, not a copy out of bounds later.
fn check_io(header: &crate::bundle::Header, weights_bytes: usize) -> Result<(), RuntimeError> {
    for r in &header.ranges {
        if r.low == 0 || r.low > r.high {
            return Err(RuntimeError::Driver(format!(
                "the bundle's range {}={}..{} is not a range of sizes",
                r.symbol, r.low, r.high
            )));
        }
    }
    let top = crate::symbolic::tops(&header.ranges);
    for (spec, kind) in
        header.inputs.iter().map(|s| (s, "input")).chain(header.outputs.iter().map(|s| (s, "output")))
    {
        let bad = |why: &str| RuntimeError::Driver(format!("the bundle's {kind} '{}' {why}", spec.name));
        if let Some(dims) = &spec.dims {
            if dims.len() != spec.shape.len() {
                return Err(bad(&format!(
                    "has {} sizes for a shape of rank {}",
                    dims.len(),
                    spec.shape.len()
                )));
            }
            if dims.iter().any(|d| d.powers.len() > header.ranges.len()) {
                return Err(bad("follows a range the bundle does not have"));
            }
            // Memory is for the top of every range: the shape there must be the one given.
            let at_top: Option<Vec<usize>> = dims.iter().map(|d| d.eval(&top)).collect();
            if at_top.as_deref() != Some(spec.shape.as_slice()) {
                return Err(bad(&format!(
                    "follows the ranges as {}, which is not its shape {:?} at their top",
                    spec.shape_text(&header.ranges),
                    spec.shape
                )));
            }
        }
        let ty = spec.tensor_type().ok_or_else(|| bad(&format!("has unknown type {}", spec.dtype)))?;
        let bytes = ty
            .checked_size_bytes()
            .ok_or_else(|| bad(&format!("has a size that overflows ({:?})", ty.shape)))?;
        let (offset, limit) = match spec.location {
            Location::Arena(o) => (o, header.arena_bytes),
            Location::Weights(o) if kind == "output" => (o, weights_bytes),
            Location::Weights(_) => return Err(bad("is placed in the weights")),
        };
        if offset.checked_add(bytes).is_none_or(|end| end > limit) {
            return Err(bad(&format!(
                "({bytes} bytes at {offset}) lies outside the bundle's memory ({limit} bytes)"
            )));
        }
    }
    Ok(())
}

/// One page-locked host buffer per input or output in `specs`, of its size (at least one byte),
/// allocated with cuMemHostAlloc `flags` (write-combined for what the host only writes).
fn staging(
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

/// A launch the driver refused, named by its kernel.
fn launch_failed(launch: &Launch, e: cudarc::driver::DriverError) -> RuntimeError {
    let ((grid, ..), (block, ..)) = (launch.config.grid_dim, launch.config.block_dim);
    RuntimeError::Driver(format!("launching kernel {} (grid {grid}, block {block}): {e:?}", launch.name))
}

/// An allocation's failure: out of memory with the bytes needed and free, else the driver's
/// error as it is.
fn out_of_memory(
    ctx: &cudarc::driver::CudaContext,
    device: &str,
    what: &str,
    needed: usize,
    e: cudarc::driver::DriverError,
) -> RuntimeError {
    if e.0 != cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        return RuntimeError::Driver(format!("allocating {what} ({needed} bytes): {e:?}"));
    }
    let (free, total) = ctx.mem_get_info().unwrap_or((0, 0));
    RuntimeError::OutOfMemory { device: device.to_string(), what: what.to_string(), needed, free, total }
}

/// The first `len` elements of a page-locked buffer, as a copy's source or destination.
struct Prefix<'s> {
    inner: &'s mut PinnedHostSlice<u8>,
    len: usize,
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

/// The device address of `location` given where the arena and the weights start.
fn device_address(location: Location, arena_ptr: u64, weights_ptr: u64) -> u64 {
    match location {
        Location::Arena(o) => arena_ptr + o as u64,
        Location::Weights(o) => weights_ptr + o as u64,
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
