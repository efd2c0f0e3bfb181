//! Graph-to-graph passes, one file per pass. [`run_passes`] runs a list of them in order and
//! verifies the graph after each; [`standard`] is the list compilation uses.

mod angles;
mod attention_masks;
mod cache_in_place;
pub mod channels_last;
mod const_fold;
mod cse;
mod dce;
mod fold_conv_affine;
mod fold_norm_scales;
mod gather_views;
mod gelu_tanh;
mod merge_matmuls;
mod noop;
mod outer_products;
mod precision;
mod repeats;
mod shared;
mod slice_early;
mod small_views;
mod split_reductions;
mod squeeze_excite;
mod weights_by_rows;

pub use attention_masks::{mask_prologue, own_attention_masks, owns_prologue};
pub use cache_in_place::CacheInPlace;
pub use channels_last::{ChannelsLast, Depthwise};
pub use const_fold::ConstFold;
pub use cse::Cse;
pub use dce::Dce;
pub use fold_conv_affine::FoldConvAffine;
pub use fold_norm_scales::FoldNormScales;
pub use gather_views::GatherNdViews;
pub use gelu_tanh::gelu_after_gemm_as_tanh;
pub use merge_matmuls::MergeSiblingMatMuls;
pub use noop::RemoveNoops;
pub use outer_products::OuterProducts;
pub use precision::{halve_constants, lower_precision, lower_precision_halved, lower_precision_sharing};
pub use repeats::RepeatsAsTiles;
pub use shared::SharedConstants;
pub use slice_early::SliceEarly;
pub use small_views::store_small_vectors;
pub use split_reductions::SplitReductions;
pub use squeeze_excite::squeeze_excite;
pub use weights_by_rows::WeightsByRows;

use thiserror::Error;

use crate::ir::{self, Graph, IrError};

/// A transformation that keeps the graph's meaning (the reference evaluator's outputs).
pub trait Pass {
    /// The pass's name in reports and errors.
    fn name(&self) -> &'static str;
    /// Rewrites `graph` in place; returns how many nodes it changed or removed.
    fn run(&self, graph: &mut Graph) -> Result<usize, IrError>;
}

/// A pass that failed, or left a graph the verifier rejects.
#[derive(Debug, Error)]
#[error("pass {pass}: {source}")]
pub struct PassError {
    /// The pass's name.
    pub pass: &'static str,
    /// What went wrong.
    pub source: IrError,
}

/// The passes compilation runs, in order.
pub fn standard() -> Vec<Box<dyn Pass>> {
    standard_sharing(None)
}

/// [`standard`], the constants its passes derive from the model's made through `shared` where
/// given (the planner for ranges plans one model at several sizes).
pub fn standard_sharing(shared: Option<&SharedConstants>) -> Vec<Box<dyn Pass + '_>> {
    let mut passes: Vec<Box<dyn Pass + '_>> = vec![
        Box::new(ConstFold),
        Box::new(FoldConvAffine),
        Box::new(GatherNdViews),
        Box::new(RemoveNoops),
        Box::new(SliceEarly),
        Box::new(Cse),
        Box::new(OuterProducts),
        Box::new(MergeSiblingMatMuls::sharing(shared)),
        Box::new(Dce),
    ];
    // Correct on an H200 but no faster: on with `FUSEC_REPEATS_AS_TILES=1` (`repeats`).
    if crate::knobs::on("FUSEC_REPEATS_AS_TILES") {
        passes.push(Box::new(RepeatsAsTiles));
    }
    passes
}

/// Runs `passes` in order, verifying after each; returns (pass, nodes changed) per pass.
pub fn run_passes(
    graph: &mut Graph,
    passes: &[Box<dyn Pass + '_>],
) -> Result<Vec<(&'static str, usize)>, PassError> {
    let mut report = Vec::with_capacity(passes.len());
    for pass in passes {
        let fail = |source| PassError { pass: pass.name(), source };
        let changed = pass.run(graph).map_err(fail)?;
        ir::verify(graph).map_err(fail)?;
        report.push((pass.name(), changed));
    }
    Ok(report)
}
