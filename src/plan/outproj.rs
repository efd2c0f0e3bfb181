//! A batch's decoding attention that computes the output projection after it
//! (`codegen::attention::outproj`): the plan keeps what the attention reads live through the
//! GEMM's step (whose output the attention's kernel then writes) and sets aside the memory
//! the heads' partial products meet in.

use crate::fusion::{Kernel, KernelKind};
use crate::ir::{Graph, Op};

/// Sequences whose attention blocks form one cluster and share their outputs there.
pub const SEQUENCES: usize = 8;

/// Whether a batch's decoding attention computes the output projection after it: only with
/// `FUSEC_ATTENTION_OUTPROJ=1`. Off by default: GPT-2 small's step at 32 sequences on an H200
/// took 0.465–0.468 ms a token with it against 0.400–0.402 without, the attention's kernel
/// 15.2 µs a layer alone against 7.2 where the product's step took 3.2 (`benches/NOTES.md`,
/// fifty-seventh session). The plan and the kernel's generator read the same knob.
pub fn enabled() -> bool {
    crate::knobs::on("FUSEC_ATTENTION_OUTPROJ")
}

/// Where `next` is a GEMM right after `this`, a decoding attention (it appends to a cache) of
/// one query row a sequence, `[batch, heads, 1, dv]`, the batch a multiple of [`SEQUENCES`]
/// and past what the attention's own projection takes (`super::projects_batch`): the bytes of
/// the memory the attention's kernel needs to compute the product itself — f32 partial
/// products `[batch, heads, N]` and a counter a batch row. `None` where it may not.
pub(crate) fn scratch_bytes(graph: &Graph, this: &Kernel, next: &Kernel) -> Option<usize> {
    if !enabled() || this.kind != KernelKind::Attention || !matches!(next.kind, KernelKind::Gemm { .. }) {
        return None;
    }
    if !this.nodes.iter().any(|&n| matches!(graph.node(n).op, Op::Append { .. })) {
        return None;
    }
    let anchor = this.nodes.iter().find(|&&n| matches!(graph.node(n).op, Op::Attention { .. }))?;
    let out = &graph.node(*anchor).ty.shape;
    let &[batch, heads, 1, _] = out.as_slice() else { return None };
    let product = graph.node(*next.nodes.first()?);
    let n = *product.ty.shape.last()?;
    let fits = batch % SEQUENCES == 0 && !super::projects_batch(batch) && batch > 1;
    fits.then(|| batch * heads * n * 4 + batch * 4)
}
