//! `compile`: the pipeline as a straight list of stages, ONNX file to bundle.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::bundle::{Bundle, Header, IoSpec, FORMAT_VERSION};
use crate::codegen::{self, CodegenError};
use crate::fusion::{self, FusionError, FusionLimits, Mode};
use crate::import::{self, ImportError, ImportOptions};
use crate::ir::DType;
use crate::nvrtc::{self, NvrtcError};
use crate::passes::{self, PassError};
use crate::plan::{Plan, PlanError};

mod ranges;

pub use ranges::{plan_symbolic, SymbolicError};

/// Why a compile stopped, by the stage that stopped it.
#[derive(Debug, Error)]
pub enum CompileError {
    /// Reading or translating the ONNX file (names the node, its op and the opset).
    #[error(transparent)]
    Import(#[from] ImportError),
    /// A graph pass.
    #[error(transparent)]
    Pass(#[from] PassError),
    /// Forming kernels from the fused graph.
    #[error("partition: {0}")]
    Partition(#[from] crate::ir::IrError),
    /// The e-graph fusion.
    #[error(transparent)]
    Fusion(#[from] FusionError),
    /// Memory planning.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// CUDA code generation.
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// NVRTC compiling the generated kernels.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// Sizes that do not follow the dims given ranges.
    #[error(transparent)]
    Symbolic(#[from] SymbolicError),
    /// A storage precision other than f32, f16 and bf16.
    #[error("precision {0} is not supported: use f32, f16 or bf16")]
    Precision(DType),
    /// The CUDA sources could not be written where `--emit` asked.
    #[error("{path}: cannot write CUDA sources: {source}")]
    Emit {
        /// The directory or file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What to compile and how.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Input shapes (`--dim`, `--input`) and what the import keeps.
    pub import: ImportOptions,
    /// One kernel per node, no fusion: the unfused baseline.
    pub no_fuse: bool,
    /// Compile PTX for this arch (`sm_90`) when NVRTC is available; the runtime compiles the
    /// sources at load time otherwise.
    pub arch: Option<String>,
    /// Write every kernel's CUDA source here.
    pub emit_cuda: Option<PathBuf>,
    /// Storage type of weights and activations: f32, f16 or bf16 (inputs and outputs stay
    /// f32; reductions accumulate in f32).
    pub precision: DType,
    /// Decisions of the cost model fixed from another compile (see
    /// [`crate::fusion::FusionLimits::attention`]); `None`: decided for this compile's sizes.
    pub attention: Option<Vec<bool>>,
    /// Half-type convolutions channels-last (the `channels-last` layout pass, fused builds):
    /// on unless `FUSEC_CHANNELS_LAST=0`; it measured 1.1–4× faster than NCHW on the CNN
    /// suite (`benches/NOTES.md`).
    pub channels_last: bool,
    /// A key/value cache updated in place (`passes::CacheInPlace`): each `present =
    /// Concat(past, new)` output holds its `past` input in its own buffer, both in the
    /// storage type, so a step writes only the new positions.
    pub cache_in_place: bool,
    /// An erf-GELU after a GEMM stays erf in half-type programs (by default it is computed in
    /// its tanh form inside cuBLASLt's epilogue, `passes::gelu_after_gemm_as_tanh`): on with
    /// `--exact-gelu` or `FUSEC_EXACT_GELU=1`.
    pub exact_gelu: bool,
    /// Half-type programs fold a norm's scale (and a LayerNorm's shift and mean) into the
    /// products that read it (`passes::FoldNormScales`): on unless `FUSEC_FOLD_NORMS=0`.
    pub fold_norm_scales: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            import: ImportOptions::default(),
            no_fuse: false,
            arch: None,
            emit_cuda: None,
            precision: DType::F32,
            attention: None,
            channels_last: std::env::var("FUSEC_CHANNELS_LAST").map_or(true, |v| v.trim() != "0"),
            cache_in_place: false,
            exact_gelu: std::env::var("FUSEC_EXACT_GELU").is_ok_and(|v| v.trim() == "1"),
            fold_norm_scales: !crate::knobs::off("FUSEC_FOLD_NORMS"),
        }
    }
}

/// import → passes → fusion → partition → plan → codegen → (NVRTC) → bundle.
pub fn compile(path: &Path, options: &CompileOptions) -> Result<Bundle, CompileError> {
    compile_reporting(path, options, &mut |_| {})
}

/// [`compile`], calling `done` with each stage's name as it ends (`import`, `passes`, `fuse`, `lower`,
/// `plan`, `codegen`, `nvrtc`): for progress and per-stage timing.
pub fn compile_reporting(
    path: &Path,
    options: &CompileOptions,
    done: &mut dyn FnMut(&'static str),
) -> Result<Bundle, CompileError> {
    let plan = if options.import.ranges().is_empty() {
        plan_reporting(path, options, done)?.0
    } else {
        let plan = plan_range(path, options)?;
        done("plan");
        plan
    };
    let kernels = plan.kernels.len();
    let gemm_calls = plan.gemm_calls();
    let graph_breaks = plan.graph_breaks;
    let (traffic_bytes, flops) = (plan.traffic_bytes(), plan.flops());
    let steps = codegen::generate(&plan)?;
    // Steps another step's launch runs (pointwise kernels merged, `codegen::siblings`) are not
    // launched.
    let merged: usize =
        steps.iter().map(|s| if let codegen::Step::Launch(k) = s { k.merges.len() } else { 0 }).sum();
    let steps_launches: usize = steps.iter().map(codegen::Step::launches).sum::<usize>() - merged;
    for source in steps.iter().flat_map(codegen::Step::sources) {
        tracing::debug!(kernel = %source.name, function = %source.function, grid = source.grid, block = source.block, "generated");
    }
    done("codegen");
    if let Some(dir) = &options.emit_cuda {
        let fail = |source| CompileError::Emit { path: dir.clone(), source };
        std::fs::create_dir_all(dir).map_err(fail)?;
        // Steps that run one function share its file: each is written once.
        let mut written = std::collections::HashSet::new();
        for source in steps.iter().flat_map(|s| s.sources()).filter(|s| written.insert(&s.function)) {
            std::fs::write(dir.join(format!("{}.cu", source.function)), nvrtc::full_source(source))
                .map_err(fail)?;
        }
    }
    let mut ptx = std::collections::BTreeMap::new();
    let arch = options.arch.clone().filter(|_| nvrtc::available());
    if let Some(arch) = &arch {
        let sources: Vec<_> = steps.iter().flat_map(|s| s.sources()).collect();
        ptx.extend(nvrtc::compile_all_cached(&sources, arch)?);
        done("nvrtc");
    }
    let graph = &plan.graph;
    let io = |bindings: &[crate::plan::Binding]| -> Vec<IoSpec> {
        bindings
            .iter()
            .map(|b| IoSpec {
                dims: plan.symbolic.as_ref().map(|_| plan.dims(b.value)),
                inside: b.inside.clone(),
                ..IoSpec::new(&b.name, &graph.node(b.value).ty, b.location)
            })
            .collect()
    };
    let header = Header {
        format_version: FORMAT_VERSION,
        model: path.display().to_string(),
        fused: !options.no_fuse,
        precision: options.precision,
        steps,
        ptx,
        arch,
        inputs: io(&plan.inputs),
        outputs: io(&plan.outputs),
        arena_bytes: plan.arena_bytes,
        kernels,
        launches: steps_launches,
        gemm_calls,
        graph_breaks,
        traffic_bytes,
        flops,
        ranges: plan.symbolic.as_ref().map(|s| s.symbols.clone()).unwrap_or_default(),
        index_checks: crate::codegen::index_checks(&plan),
        index_limits: crate::codegen::index_limits(&plan),
    };
    Ok(Bundle { header, weights: plan.weights })
}

/// The program for the ranges of `options.import` ([`plan_symbolic`]), planned
/// at their top, with the size of every value as an expression of them.
pub fn plan_range(path: &Path, options: &CompileOptions) -> Result<Plan, CompileError> {
    let (mut plan, symbolic) = plan_symbolic(path, options)?;
    // A session reads each range's size from an input axis that is that dim alone (times a
    // whole number): one must exist. A sum of others is its parts' sizes added.
    for (i, range) in symbolic.symbols.iter().enumerate() {
        if !range.is_sum()
            && !plan.inputs.iter().any(|b| symbolic.shape(b.value).iter().any(|d| d.alone() == Some(i)))
        {
            let inputs: Vec<String> =
                plan.inputs.iter().map(|b| format!("{} {}", b.name, symbolic.display(b.value))).collect();
            return Err(SymbolicError::Unreadable {
                symbol: range.symbol.clone(),
                inputs: inputs.join(", "),
            }
            .into());
        }
    }
    plan.symbolic = Some(symbolic);
    Ok(plan)
}

/// The stages of [`compile`] up to the plan (import → passes → fusion → lower → partition →
/// plan), calling `done` as each ends: what `fusec inspect` draws and lists, exactly the program
/// `compile` generates code for; with fusion's report unless `options.no_fuse`.
pub fn plan_reporting(
    path: &Path,
    options: &CompileOptions,
    done: &mut dyn FnMut(&'static str),
) -> Result<(Plan, Option<fusion::FusionReport>), CompileError> {
    let model = import::import(path, &options.import)?;
    plan_model(model, path, options, done)
}

/// [`plan_reporting`] of a model already imported from `path` with `options.import`.
pub fn plan_model(
    model: import::Model,
    path: &Path,
    options: &CompileOptions,
    done: &mut dyn FnMut(&'static str),
) -> Result<(Plan, Option<fusion::FusionReport>), CompileError> {
    let (mut plan, report) = plan_unplaced(model, path, options, done, None)?;
    plan.place_weights();
    tracing::info!(
        "plan: {} launches, {} activation bytes at peak, {} weight bytes",
        plan.kernels.len(),
        plan.arena_bytes,
        plan.weights.len()
    );
    done("plan");
    Ok((plan, report))
}

/// [`plan_model`] up to a plan whose constants are still in its graph
/// ([`Plan::unplaced`]), constants converted to the precision through `shared` where given.
pub(crate) fn plan_unplaced(
    model: import::Model,
    path: &Path,
    options: &CompileOptions,
    done: &mut dyn FnMut(&'static str),
    shared: Option<&passes::SharedConstants>,
) -> Result<(Plan, Option<fusion::FusionReport>), CompileError> {
    let fused = fuse_model(model, path, options, done, shared)?;
    lower_fused(fused, options, done, shared, None)
}

/// A model through the passes and fusion, not yet lowered to the precision.
pub(crate) struct FusedModel {
    graph: crate::ir::Graph,
    covers: std::collections::HashMap<crate::ir::NodeId, Vec<String>>,
    mode: Mode,
    report: Option<fusion::FusionReport>,
}

impl FusedModel {
    /// Fusion's report, unless the build is unfused.
    pub(crate) fn report(&self) -> Option<&fusion::FusionReport> {
        self.report.as_ref()
    }

    /// The graph, whose f32 constants [`passes::halve_constants`] may take.
    pub(crate) fn graph_mut(&mut self) -> &mut crate::ir::Graph {
        &mut self.graph
    }
}

/// The stages of [`plan_unplaced`] up to fusion, constants derived from the model's through
/// `shared` where given.
pub(crate) fn fuse_model(
    model: import::Model,
    path: &Path,
    options: &CompileOptions,
    done: &mut dyn FnMut(&'static str),
    shared: Option<&passes::SharedConstants>,
) -> Result<FusedModel, CompileError> {
    tracing::info!(
        "imported {}: {} ONNX nodes, {} IR nodes ({} folded into constants)",
        path.display(),
        model.onnx.node_count,
        model.graph.op_histogram().values().sum::<usize>(),
        model.folded_nodes
    );
    done("import");
    let fused = if options.no_fuse {
        FusedModel {
            graph: model.graph,
            covers: Default::default(),
            mode: Mode::OneKernelPerNode,
            report: None,
        }
    } else {
        let mut graph = model.graph;
        passes::run_passes(&mut graph, &passes::standard_sharing(shared))?;
        done("passes");
        let limits = FusionLimits {
            precision: options.precision,
            attention: options.attention.clone(),
            ..Default::default()
        };
        let mut fused = fusion::fuse(&graph, &limits)?;
        tracing::info!("fusion: {}", fused.report);
        // Norms' scales into the products after them, in a half type (after fusion, which
        // recognises the norms; before the constants are converted, from the model's values).
        if options.precision != DType::F32 && options.fold_norm_scales {
            let fold: Vec<Box<dyn passes::Pass + '_>> =
                vec![Box::new(passes::FoldNormScales::sharing(shared))];
            passes::run_passes(&mut fused.graph, &fold)?;
        }
        FusedModel { graph: fused.graph, covers: fused.covers, mode: Mode::Fused, report: Some(fused.report) }
    };
    done("fuse");
    Ok(fused)
}

/// The stages of [`plan_unplaced`] after fusion: lowered to the precision (its f16 constants
/// `halved` already where given, [`passes::halve_constants`]), the passes on the lowered
/// graph, the partition and the plan.
pub(crate) fn lower_fused(
    fused: FusedModel,
    options: &CompileOptions,
    done: &mut dyn FnMut(&'static str),
    shared: Option<&passes::SharedConstants>,
    halved: Option<std::collections::HashMap<crate::ir::NodeId, std::sync::Arc<crate::ir::Tensor>>>,
) -> Result<(Plan, Option<fusion::FusionReport>), CompileError> {
    let FusedModel { graph, covers, mode, report } = fused;
    let (graph, covers) = match options.precision {
        DType::F32 => (graph, covers),
        DType::F16 | DType::BF16 => {
            let (lowered, moved) = passes::lower_precision_halved(graph, options.precision, shared, halved)
                .map_err(|source| PassError { pass: "lower-precision", source })?;
            let covers =
                covers.into_iter().filter_map(|(old, names)| Some((*moved.get(&old)?, names))).collect();
            (lowered, covers)
        }
        other => return Err(CompileError::Precision(other)),
    };
    done("lower");
    let (mut graph, mut covers) = (graph, covers);
    // Convolutions channels-last where asked and the element type wants it (the unfused
    // baseline keeps the model's NCHW).
    if mode == Mode::Fused
        && options.channels_last
        && passes::channels_last::wanted(&graph, options.precision)
    {
        use passes::Pass;
        passes::ChannelsLast.run(&mut graph).map_err(|source| PassError { pass: "channels-last", source })?;
        crate::ir::verify(&graph).map_err(|source| PassError { pass: "channels-last", source })?;
    }
    if options.cache_in_place {
        use passes::Pass;
        passes::CacheInPlace
            .run(&mut graph)
            .map_err(|source| PassError { pass: "cache-in-place", source })?;
        crate::ir::verify(&graph).map_err(|source| PassError { pass: "cache-in-place", source })?;
    }
    if mode == Mode::Fused {
        use passes::Pass;
        passes::SplitReductions
            .run(&mut graph)
            .map_err(|source| PassError { pass: "split-reductions", source })?;
        crate::ir::verify(&graph).map_err(|source| PassError { pass: "split-reductions", source })?;
        passes::squeeze_excite(&mut graph, &mut covers)
            .map_err(|source| PassError { pass: "squeeze-excite", source })?;
        crate::ir::verify(&graph).map_err(|source| PassError { pass: "squeeze-excite", source })?;
        passes::store_small_vectors(&mut graph)
            .map_err(|source| PassError { pass: "small-vectors", source })?;
        crate::ir::verify(&graph).map_err(|source| PassError { pass: "small-vectors", source })?;
        if options.precision != DType::F32 && !options.exact_gelu {
            passes::gelu_after_gemm_as_tanh(&mut graph)
                .map_err(|source| PassError { pass: "gelu-tanh", source })?;
        }
        passes::own_attention_masks(&mut graph, &mut covers)
            .map_err(|source| PassError { pass: "attention-masks", source })?;
        // After fusion, whose constant folding would undo it.
        passes::WeightsByRows::sharing(shared)
            .run(&mut graph)
            .map_err(|source| PassError { pass: "weights-by-rows", source })?;
        crate::ir::verify(&graph).map_err(|source| PassError { pass: "weights-by-rows", source })?;
    }
    let partition = fusion::partition(&graph, &covers, mode)?;
    Ok((Plan::unplaced(graph, partition)?, report))
}
