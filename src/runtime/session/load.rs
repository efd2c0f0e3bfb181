//! Loading a bundle on a GPU: its kernels (PTX from the bundle or compiled now), weights,
//! arena, cuBLAS/cuBLASLt handles and staging buffers; the header checked first.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::super::dnn::{self, ConvCall, Dnn};
use super::io::staging;
use super::launch::{device_address, programmatic_launch_forced, waits_for_predecessor, Launch, Loaded};
use super::{blas, driver, driver_available, lt, RuntimeError, Session, SessionOptions};
use crate::bundle::Bundle;
use crate::codegen::{KernelSource, Step};
use crate::nvrtc;
use crate::plan::Location;

impl Session {
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
        if !super::super::library_present(
            super::super::Library::Cublas,
            cudarc::cublas::sys::is_culib_present,
        ) {
            return Err(RuntimeError::NoCublas);
        }
        let ctx = super::super::context(device)?;
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
        // Settled now, or (None) chosen by timing the program both ways once it is loaded.
        let forced = programmatic_launch_forced(major, options.programmatic_launch);
        let pdl = forced == Some(true);
        let top = crate::ir::tops(&header.ranges);
        // Whether an operand's location lies inside the bundle's memory.
        let inside = |location: Location| match location {
            Location::Arena(o) => o < header.arena_bytes.max(1),
            Location::Weights(o) => o < bundle.weights.len().max(1),
        };
        // The word the kernels' gathers report an index outside its axis in.
        let faults = super::faults::IndexFaults::new(&stream, &header.index_checks)?;
        let mut load = |source: &KernelSource| -> Result<Launch, RuntimeError> {
            let function = match functions.get(&source.function) {
                Some(f) => f.clone(),
                None => {
                    let ptx = ptx_of.get(&source.function).cloned().ok_or_else(|| {
                        RuntimeError::Driver(format!("no PTX for kernel {}", source.function))
                    })?;
                    let module = ctx.load_module(Ptx::from_src(ptx)).map_err(driver)?;
                    if let Some(faults) = &faults {
                        faults.install(&module, &stream)?;
                    }
                    let f = module.load_function(&source.function).map_err(driver)?;
                    functions.insert(source.function.clone(), f.clone());
                    f
                }
            };
            let args = source
                .args
                .iter()
                .map(|&location| {
                    inside(location).then(|| device_address(location, arena_ptr, weights_ptr)).ok_or_else(
                        || {
                            RuntimeError::Driver(format!(
                                "kernel {}: argument {location:?} lies outside the bundle's memory",
                                source.name
                            ))
                        },
                    )
                })
                .collect::<Result<Vec<u64>, _>>()?;
            let config = LaunchConfig {
                grid_dim: (source.grid, 1, 1),
                block_dim: (source.block, 1, 1),
                shared_mem_bytes: 0,
            };
            let waits = waits_for_predecessor(source);
            let pointers = args.len();
            Ok(Launch {
                name: source.name.clone(),
                function,
                config,
                args,
                pointers,
                programmatic: pdl && waits,
                waits,
                scale: source.scale.clone(),
                variants: Vec::new(),
                attention: None,
                merges: source.merges.clone(),
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
        // cuDNN for the convolutions, and the scratch its algorithm search measures with,
        // kept as their workspace (shrunk to what the chosen algorithms need).
        let dnn = match header.steps.iter().any(|s| matches!(s, Step::Conv { .. })) {
            true => Some(Dnn::new(device, &stream)?),
            false => None,
        };
        let mut conv_workspace = match dnn {
            Some(_) => {
                let (free, _) = ctx.mem_get_info().map_err(driver)?;
                let bytes = dnn::scratch_bytes(free).max(1);
                Some(
                    stream
                        .alloc_zeros::<u8>(bytes)
                        .map_err(|e| memory("the convolutions' workspace", bytes, e))?,
                )
            }
            None => None,
        };
        let scratch = conv_workspace.as_ref().map_or((0, 0), |w| (w.device_ptr(&stream).0, w.len()));
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
                Step::Gemm { gemm, epilogue, skinny, skinny_narrow, absorbs } => {
                    let bias = gemm
                        .lt_epilogue
                        .and_then(|e| e.bias)
                        .map(|b| device_address(b, arena_ptr, weights_ptr));
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
                    // fusec's kernel for a product of a few rows, a candidate where GEMMs are
                    // timed (with cuBLASLt, which also runs such a product's epilogue).
                    let mut few_rows =
                        |source: Option<&KernelSource>| match (tune && prepared.is_some(), source) {
                            (true, Some(source)) => {
                                let mut launch = load(source)?;
                                // On by default (`FUSEC_PDL=0` turns it off): its first packs
                                // of weights are requested before it waits for the kernel before
                                // it, so their latency overlaps that kernel's end.
                                launch.programmatic |= forced != Some(false) && waits_for_predecessor(source);
                                Ok::<_, RuntimeError>(Some(launch))
                            }
                            _ => Ok(None),
                        };
                    let mut skinny = few_rows(skinny.as_ref())?;
                    let mut skinny_narrow = match &skinny {
                        Some(_) => few_rows(skinny_narrow.as_deref())?.map(Box::new),
                        None => None,
                    };
                    // `FUSEC_SKINNY_NARROW=1`: the second kernel (narrow tiles, or a vocabulary's
                    // with A staged) alone, in the first one's place (with `FUSEC_SKINNY=1`,
                    // every such product on them: for testing them).
                    if crate::knobs::on("FUSEC_SKINNY_NARROW") {
                        if let Some(narrow) = skinny_narrow.take() {
                            skinny = Some(*narrow);
                        }
                    }
                    // The norm it may take in: a kernel step before it.
                    let absorbs = *absorbs;
                    if absorbs.is_some_and(|j| !matches!(steps.get(j), Some(Loaded::Kernel(_)))) {
                        return Err(RuntimeError::Driver(format!(
                            "GEMM step {}: the norm it takes in (step {absorbs:?}) is not a kernel before it",
                            steps.len()
                        )));
                    }
                    Loaded::Gemm {
                        gemm: gemm.clone(),
                        epilogue,
                        on_cublas: plain,
                        lt: prepared,
                        skinny,
                        skinny_narrow,
                        on_skinny: false,
                        on_narrow: false,
                        absorbs,
                    }
                }
                Step::Conv { conv, epilogue } => {
                    if ![conv.x, conv.w, conv.y].into_iter().all(inside) {
                        return Err(RuntimeError::Driver(
                            "a convolution's operand lies outside the bundle's memory".into(),
                        ));
                    }
                    let dnn = dnn.as_ref().ok_or_else(|| RuntimeError::Driver("no cuDNN handle".into()))?;
                    let at = |l| device_address(l, arena_ptr, weights_ptr);
                    let fused = conv.fused.map(|f| (at(f.bias), at(f.residual.unwrap_or(conv.y))));
                    if !conv.fused.iter().flat_map(|f| [Some(f.bias), f.residual]).flatten().all(inside) {
                        return Err(RuntimeError::Driver(
                            "a convolution's bias or residual lies outside the bundle's memory".into(),
                        ));
                    }
                    let call = ConvCall::new(
                        dnn,
                        conv,
                        (at(conv.x), at(conv.w), at(conv.y)),
                        scratch,
                        &device_name,
                        fused,
                    )?;
                    // With cuDNN running the epilogue, its kernel is not run — but kept for a
                    // convolution set up again at the ranges' other points, which cuDNN may
                    // not fuse.
                    let kept = match (call.fused(), conv.batch.is_some()) {
                        (true, false) => None,
                        _ => epilogue.as_ref().map(|e| load(e)?.at(&top)).transpose()?,
                    };
                    let (epilogue, spare) =
                        if call.fused() { (None, kept.map(Box::new)) } else { (kept, None) };
                    Loaded::Conv { spec: conv.clone(), call: Arc::new(call), epilogue, spare }
                }
            });
        }
        super::tuning::leave_out_merged(&mut steps);
        let needed = steps
            .iter()
            .filter_map(|s| match s {
                Loaded::Conv { call, .. } => Some(call.workspace),
                _ => None,
            })
            .max();
        if let (Some(needed), Some(w)) = (needed, &conv_workspace) {
            if needed < w.len() {
                stream.synchronize().map_err(driver)?;
                conv_workspace = Some(
                    stream
                        .alloc_zeros::<u8>(needed.max(1))
                        .map_err(|e| memory("the convolutions' workspace", needed, e))?,
                );
            }
        }
        stream.synchronize().map_err(driver)?;
        let mut session = Session {
            faults,
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
            programmatic_forced: forced.or((!(options.tune_gemms && options.cuda_graph)).then_some(false)),
            launch_choice: None,
            staging_in: staging(&ctx, &header.inputs, sys::CU_MEMHOSTALLOC_WRITECOMBINED)?,
            staging_out: staging(&ctx, &header.outputs, 0)?,
            dnn,
            conv_workspace,
            state: Default::default(),
            pinned: Default::default(),
            tuning_ones: super::programmatic::tuning_ones(header),
        };
        // Whether the load times anything: the GEMMs' algorithms or programmatic launch.
        let timed = tune || session.programmatic_forced.is_none();
        if timed {
            // What they are timed on.
            session.stage_tuning_inputs()?;
        }
        // Other sessions time nothing meanwhile.
        let one_at_a_time =
            timed.then(|| lt::TUNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let mut cache = tune.then(|| lt::AlgoCache::open(nvrtc::cache_dir(), &session.device_name));
        let (mut choices, mut passes) = match cache.as_mut() {
            Some(cache) => session.first_pass(cache, options.cuda_graph)?,
            None => Default::default(),
        };
        // The second pass under the launches the session keeps (`FUSEC_TUNE_SECOND_PASS=before`:
        // before they are chosen, for measuring).
        let before = super::tuning::second_pass_before_launch();
        if before {
            session.second_pass(&mut passes)?;
        }
        session.launch_choice = session.choose_programmatic()?;
        if let Some(cache) = cache.as_mut() {
            if !before {
                session.second_pass(&mut passes)?;
            }
            choices.extend(session.finish(cache, passes));
            session.gemm_choices = choices;
            cache.save();
        }
        drop(one_at_a_time);
        if timed {
            // The inputs as a session holds them before its first run: zeros.
            session.zero_tuning_inputs()?;
            session.stream.synchronize().map_err(driver)?;
        }
        // An index the tuning values led outside its table is not the first run's to report.
        if let Err(e) = session.check_indices() {
            tracing::debug!("while the program was timed at load: {e}");
        }
        Ok(session)
    }
}

/// Every input and output of the bundle lies inside its memory (the arena, or for an output
/// the weights), with a size that fits in memory: a damaged or hostile header is an error
/// here, not a copy out of bounds later.
pub(super) fn check_io(header: &crate::bundle::Header, weights_bytes: usize) -> Result<(), RuntimeError> {
    for r in &header.ranges {
        // 0 at the low end only: a cache's length (nothing cached).
        if r.high == 0 || r.low > r.high {
            return Err(RuntimeError::Driver(format!(
                "the bundle's range {}={}..{} is not a range of sizes",
                r.symbol, r.low, r.high
            )));
        }
    }
    let top = crate::ir::tops(&header.ranges);
    // A sum of others (`total=past+seq`) is its parts' sizes added, at the top as everywhere.
    if crate::ir::with_sums(&header.ranges, &top).as_ref() != Some(&top) {
        return Err(RuntimeError::Driver(format!(
            "the bundle's ranges ({}) name a sum that is not its parts' sizes added",
            crate::ir::ranges_text(&header.ranges)
        )));
    }
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
        let mut bytes = ty
            .checked_size_bytes()
            .ok_or_else(|| bad(&format!("has a size that overflows ({:?})", ty.shape)))?;
        if let Some(inside) = &spec.inside {
            // Rows of the input, each inside a row of the output it is stored in.
            let output = header.outputs.iter().find(|o| o.name == inside.output);
            let fits = kind == "input"
                && spec.dims.is_none()
                && inside.rows.checked_mul(inside.row_bytes) == Some(bytes)
                && inside.row_bytes <= inside.pitch_bytes
                && output.is_some_and(|o| {
                    o.location == spec.location
                        && o.tensor_type().and_then(|t| t.checked_size_bytes())
                            == inside.rows.checked_mul(inside.pitch_bytes)
                });
            if !fits {
                return Err(bad(&format!("is not laid out inside output '{}' as it says", inside.output)));
            }
            bytes = inside.span_bytes();
        }
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

/// An allocation's failure: out of memory with the bytes needed and free, else the driver's
/// error as it is.
pub(super) fn out_of_memory(
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
