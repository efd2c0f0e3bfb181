//! Fusion by equality saturation (egg): the IR graph goes into an e-graph, rule sets
//! (`rules/`) recognise LayerNorm, RMSNorm, GELU, softmax and attention in exporters'
//! primitives and remove what inference does not need, extraction picks the cheapest form
//! under the cost model (`cost.rs`), and the partition (`partition.rs`) groups the result
//! into kernels. Knows nothing of CUDA.

mod analysis;
mod convert;
mod cost;
mod extract;
mod lang;
mod partition;
pub mod rules;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use egg::Runner;
use thiserror::Error;

pub use analysis::{FusionAnalysis, FusionGraph};
pub use cost::LAUNCH_BYTES;
pub use lang::{ConstId, FusionLang, InputId, OpId, Perm};
pub use partition::{append_behind, decoding_takes_appends, partition, Kernel, KernelKind, Mode, Partition};

use crate::ir::{Graph, IrError, NodeId};

/// Why fusion failed.
#[derive(Debug, Error)]
pub enum FusionError {
    /// The graph is not valid, before or after.
    #[error("fusion: {0}")]
    Ir(#[from] IrError),
    /// The fused graph could not be rebuilt from the e-graph.
    #[error("fusion: extraction: {0}")]
    Extraction(String),
}

/// The runner's limits (saturation stops at whichever comes first), and the precision the
/// graph will run in, which the cost model prices matrix products at.
#[derive(Clone, Debug)]
pub struct FusionLimits {
    /// Rule applications over the whole e-graph, at most.
    pub iterations: usize,
    /// E-nodes, at most.
    pub nodes: usize,
    /// Time, at most.
    pub time: Duration,
    /// The storage precision the fused graph is lowered to (f32, f16 or bf16).
    pub precision: crate::ir::DType,
    /// Whether each attention takes the attention kernel, decided elsewhere (in the order of
    /// [`FusionReport::attention`]) instead of by the cost model: a program for a range of
    /// sizes decides as at the top of the range.
    pub attention: Option<Vec<bool>>,
}

impl Default for FusionLimits {
    fn default() -> Self {
        FusionLimits {
            iterations: 30,
            nodes: 200_000,
            time: Duration::from_secs(10),
            precision: crate::ir::DType::F32,
            attention: None,
        }
    }
}

/// What saturation did.
#[derive(Clone, Debug)]
pub struct FusionReport {
    /// Why it stopped (`Saturated`: no rule had anything left to add).
    pub stop_reason: String,
    /// Iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub egraph_nodes: usize,
    /// E-classes at the end.
    pub egraph_classes: usize,
    /// Time saturating.
    pub saturation_time: Duration,
    /// Time extracting the cheapest graph.
    pub extraction_time: Duration,
    /// Whether each attention took the attention kernel (rather than GEMMs and a softmax), in
    /// the order of their e-classes' ids.
    pub attention: Vec<bool>,
}

impl std::fmt::Display for FusionReport {
    /// `Saturated after 7 iterations (191 e-nodes, 122 classes): saturation 8.3 ms, extraction 4.6 ms`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} after {} iterations ({} e-nodes, {} classes): saturation {:.1} ms, extraction {:.1} ms",
            self.stop_reason,
            self.iterations,
            self.egraph_nodes,
            self.egraph_classes,
            self.saturation_time.as_secs_f64() * 1e3,
            self.extraction_time.as_secs_f64() * 1e3
        )
    }
}

/// A fused graph: IR with fused ops, and the ONNX nodes each of its nodes covers.
pub struct Fused {
    /// The fused graph.
    pub graph: Graph,
    /// ONNX node names by fused node.
    pub covers: HashMap<NodeId, Vec<String>>,
    /// What saturation did.
    pub report: FusionReport,
}

impl Fused {
    /// How many nodes of each kind the fused graph has (`LayerNorm`, `Attention`, …).
    pub fn histogram(&self) -> BTreeMap<String, usize> {
        self.graph.op_histogram()
    }
}

/// Runs the rule sets on `graph` to saturation (or the limits) and extracts the cheapest
/// equivalent graph.
pub fn fuse(graph: &Graph, limits: &FusionLimits) -> Result<Fused, FusionError> {
    let convert::Lowered { egraph, class_of } = convert::lower(graph)?;
    let started = Instant::now();
    let runner = Runner::default()
        .with_iter_limit(limits.iterations)
        .with_node_limit(limits.nodes)
        .with_time_limit(limits.time)
        .with_egraph(egraph)
        .run(&rules::all());
    let saturation_time = started.elapsed();
    let stop_reason = runner.stop_reason.as_ref().map_or_else(|| "not run".to_string(), |r| format!("{r:?}"));
    let egraph = runner.egraph;
    let started = Instant::now();
    let extracted =
        extract::extract(graph, &class_of, &egraph, limits.precision, limits.attention.as_deref())?;
    let report = FusionReport {
        stop_reason,
        iterations: runner.iterations.len(),
        egraph_nodes: egraph.total_number_of_nodes(),
        egraph_classes: egraph.number_of_classes(),
        saturation_time,
        extraction_time: started.elapsed(),
        attention: extracted.attention,
    };
    Ok(Fused { graph: extracted.graph, covers: extracted.covers, report })
}
