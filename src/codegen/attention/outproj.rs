//! A batch's output projection computed by its decoding attention kernel
//! (`templates/attention_outproj.cu.hbs`). In a step of a batch of sequences the product
//! after the attention, `[batch, heads·dv] · [heads·dv, N]` plus its bias and residual, is a
//! launch of its own whose weights arrive after the attention's last block; here the
//! attention's blocks are in clusters of [`SEQUENCES`] sequences of one head, each block
//! holding an eighth of the head's rows of the weights (fetched before the kernel waits for
//! the one before it). Each block multiplies the cluster's outputs (read through distributed
//! shared memory) by its columns and stores f32 partial products; the last block of the
//! heads to finish a chunk of rows and columns adds them up, with the bias and the residual,
//! and stores the product where the GEMM's step would have. That step is left out
//! (`KernelSource::merges`): a layer of a batch's step loses a dependent launch. Measured
//! slower than the product's own step (`benches/NOTES.md`, fifty-seventh session), it is off
//! unless `FUSEC_ATTENTION_OUTPROJ=1`.

use serde_json::json;

use super::Problem;
use crate::codegen::gemm;
use crate::codegen::kernel::Body;
use crate::fusion::Kernel;
use crate::ir::{DType, NodeId, Op};
use crate::plan::outproj::{self, SEQUENCES};
use crate::plan::{Location, Plan};

/// Static shared memory a block's weights may take.
const WEIGHT_BYTES: usize = 32 * 1024;

/// The product the kernel computes: the template's data and the step it stands in for.
pub(super) struct OutProjection {
    pub data: serde_json::Value,
    pub merges: Vec<usize>,
}

/// Where the decoding attention of `kernel` can compute the GEMM after it: the plan set its
/// memory aside (`plan::outproj`), the GEMM's step right after this one, its A the attention's
/// output as stored (`[batch, heads·dv]`, row b the sequence's heads in order), its weights
/// `[K, N]` among the constants, its epilogue a bias and a residual at most, half types, one
/// size. Only with `FUSEC_ATTENTION_OUTPROJ=1` (`plan::outproj::enabled`: slower as measured).
pub(super) fn projection(
    body: &mut Body<'_>,
    kernel: &Kernel,
    problem: &Problem,
) -> Result<Option<OutProjection>, String> {
    let plan = body.plan;
    let graph = &plan.graph;
    let (Some(Location::Arena(scratch)), None) = (plan.scratch, &plan.symbolic) else { return Ok(None) };
    if !outproj::enabled() {
        return Ok(None);
    }
    let Some(index) = plan.kernels.iter().position(|k| std::ptr::eq(k, kernel)) else { return Ok(None) };
    let Some(product) = plan.kernels.get(index + 1) else { return Ok(None) };
    if outproj::scratch_bytes(graph, kernel, product).is_none() || product.outputs.len() != 1 {
        return Ok(None);
    }
    let &[batch, heads, 1, dv] = problem.out.as_slice() else { return Ok(None) };
    let dtype = graph.node(problem.anchor).ty.dtype;
    let node = product.nodes[0];
    let Some(&out) = plan.locations.get(&product.outputs[0]) else { return Ok(None) };
    let Ok(spec) = gemm::spec(plan, node, out) else { return Ok(None) };
    let Some((bias, residual)) = gemm::bias_and_residual(plan, product, node, &spec) else { return Ok(None) };
    let n = spec.n;
    let fits = spec.m == batch
        && spec.k == heads * dv
        && spec.batch == 1
        && spec.alpha == 1.0
        && spec.dtype == dtype
        && matches!(dtype, DType::F16 | DType::BF16)
        && spec.out.is_none()
        && spec.dims.is_none()
        && !spec.a.transposed
        && !spec.b.transposed
        && matches!(spec.b.location, Location::Weights(_))
        && product.store_views.is_empty()
        && !product.kind.widens()
        && n % (8 * SEQUENCES) == 0
        && dv * (n / SEQUENCES) * 2 <= WEIGHT_BYTES;
    if !fits || !stores_a(plan, kernel, problem.anchor, node, spec.a.location) {
        return Ok(None);
    }
    body.declare("op_w", spec.b.location, dtype, false)?;
    if let Some(b) = bias {
        body.declare("op_bias", b, dtype, false)?;
    }
    if let Some(r) = residual {
        body.declare("op_res", r, dtype, false)?;
    }
    body.declare("op_c", spec.c, dtype, true)?;
    body.declare("op_part", Location::Arena(scratch), DType::F32, true)?;
    body.declare("op_count", Location::Arena(scratch + batch * heads * n * 4), DType::I32, true)?;
    let data = json!({
        "heads": heads,
        "n": n,
        "columns": n / SEQUENCES,
        "sequences": SEQUENCES,
        "bias": bias.is_some(),
        "residual": residual.is_some(),
    });
    Ok(Some(OutProjection { data, merges: vec![index + 1] }))
}

/// Whether the attention `anchor` (`[batch, heads, 1, dv]`) is stored where GEMM `gemm` reads
/// its A (`at`), as the rows of the product: in its own layout, or through a chain of
/// reshapes and transposes that keep its axes longer than one in order (its linear index
/// unchanged), and A is that stored value through views.
fn stores_a(plan: &Plan, kernel: &Kernel, anchor: NodeId, gemm: NodeId, at: Location) -> bool {
    let graph = &plan.graph;
    let target = kernel.store_views.iter().find(|(v, _)| *v == anchor).map_or(anchor, |&(_, view)| view);
    if plan.locations.get(&target) != Some(&at) {
        return false;
    }
    let stored = |id: NodeId| plan.locations.contains_key(&id);
    let Some(&a) = graph.inputs_of(gemm).first() else { return false };
    if crate::plan::stored_value(graph, a, &stored) != Some(target) {
        return false;
    }
    let mut at = target;
    while at != anchor {
        let node = graph.node(at);
        let Some(&input) = graph.inputs_of(at).first() else { return false };
        match &node.op {
            Op::Reshape { .. } => {}
            Op::Transpose { perm } => {
                let shape = &graph.node(input).ty.shape;
                let long: Vec<usize> = perm.iter().copied().filter(|&p| shape[p] > 1).collect();
                if long.windows(2).any(|w| w[0] > w[1]) {
                    return false;
                }
            }
            _ => return false,
        }
        at = input;
    }
    true
}
