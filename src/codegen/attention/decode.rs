//! Attention of a decoding step: one query row a batch × head, keys over a cache
//! (`templates/attention_decode.cu.hbs`). The tensor-core kernel computes 16 query rows a warp
//! and stages key tiles through shared memory; for one row that is a chain of copies, barriers
//! and products of which a sixteenth counts. Here each key is read straight into the registers
//! of a group of lanes, 16 bytes a lane, the keys that weigh anything (found from the mask
//! first) split evenly over the blocks of a cluster and their lanes.

use serde_json::json;

use super::{forced_cluster, half_names, Common, Problem, MULTIPROCESSORS};
use crate::codegen::expr::header;
use crate::codegen::kernel::{coords_decl, Body};
use crate::codegen::KernelSource;
use crate::fusion::Kernel;
use crate::ir::{DType, SymDim};
use crate::knobs;
use crate::plan::Plan;

/// Threads a block.
const THREADS: usize = 128;
/// Keys a lane group has in flight at once.
const UNROLL: usize = 4;

/// Threads a block and keys a lane group a trip: [`THREADS`] and [`UNROLL`] unless
/// `FUSEC_ATTENTION_DECODE_THREADS` (64, 128, 256 or 512) or `FUSEC_ATTENTION_DECODE_UNROLL`
/// (1, 2, 4 or 8) says otherwise, for measuring them.
fn launch() -> (usize, usize) {
    (
        knobs::one_of("FUSEC_ATTENTION_DECODE_THREADS", &[64, 128, 256, 512]).unwrap_or(THREADS),
        knobs::one_of("FUSEC_ATTENTION_DECODE_UNROLL", &[1, 2, 4, 8]).unwrap_or(UNROLL),
    )
}

/// The decoding kernel for `problem`, where it applies: half types, one query row (at the top
/// of any ranges, and fixed), the depth and the value width multiples of 8 of at most 256,
/// and K and V rows contiguous in 16-byte runs. `FUSEC_ATTENTION_DECODE=0` turns it off, for
/// measuring it against the tensor-core kernel.
pub(super) fn generate(
    plan: &Plan,
    kernel: &Kernel,
    problem: &Problem,
    name: &str,
    hb: &handlebars::Handlebars<'_>,
) -> Result<Option<KernelSource>, String> {
    let dtype = plan.graph.node(problem.anchor).ty.dtype;
    let rank = problem.rank();
    let one_query = problem.out_dims[rank - 2].value() == Some(1);
    let (depth, dv) = (problem.depth, problem.dv());
    let fits = depth % 8 == 0 && dv % 8 == 0 && depth.max(dv) <= 256;
    let off = knobs::off("FUSEC_ATTENTION_DECODE");
    if !matches!(dtype, DType::F16 | DType::BF16) || !one_query || !fits || off {
        return Ok(None);
    }
    let mut body = Body::new(plan, kernel);
    body.headers.extend(header(dtype));
    let (coord_decls, batch) = coords_decl("c", "bh", &problem.out_dims[..rank - 2]);
    let operands = problem.operands(&mut body, kernel, &batch)?;
    let k_address = problem.packed_address(&mut body, 1, &batch, ["d", "t"], 2, 8, dtype)?;
    let v_address = problem.packed_address(&mut body, 2, &batch, ["t", "e"], 1, 8, dtype)?;
    let (Some(k_address), Some(v_address)) = (k_address, v_address) else { return Ok(None) };
    let group = depth.max(dv).div_ceil(8).next_power_of_two();
    let cluster = cluster_size(problem.heads());
    let (half, _) = half_names(dtype);
    let scan = problem.inputs.len() > 3 && operands.causal.is_none();
    let (threads, unroll) = launch();
    let data = json!({
        "half": half,
        "threads": threads,
        "group": group,
        "unroll": unroll,
        "cluster": (cluster > 1).then_some(cluster),
        "scan": scan,
        "early_scan": scan && mask_is_fixed(plan, kernel, problem),
        "keys": problem.keys_dims.c(),
        "depth": depth,
        "dv": dv,
        "k_address": k_address,
        "v_address": v_address,
    });
    let common = Common { name, kernel, problem, body: &body, coords: coord_decls, operands };
    let mut source = common.render(hb, "attention_decode", data, 1, problem.heads() * cluster, threads)?;
    if let Some(scale) = &mut source.scale {
        scale.times = scale.times.mul(&SymDim::lit(cluster));
    }
    Ok(Some(source))
}

/// Whether the mask reads only memory no kernel of the program writes — graph inputs other
/// than a cache appended in place, and constants — through the kernel's own ops and views:
/// then the kernel looks through it before waiting for the kernel before it (programmatic
/// dependent launch), so that the scan overlaps that kernel. `FUSEC_ATTENTION_EARLY_SCAN=0`
/// keeps the scan after the wait, for measuring it.
fn mask_is_fixed(plan: &Plan, kernel: &Kernel, problem: &Problem) -> bool {
    if knobs::off("FUSEC_ATTENTION_EARLY_SCAN") {
        return false;
    }
    let graph = &plan.graph;
    let Some(&mask) = problem.inputs.get(3) else { return false };
    let mut stack = vec![mask];
    let mut seen = std::collections::HashSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let node = graph.node(id);
        let computed_here = kernel.nodes.contains(&id) && id != problem.anchor;
        let view = !plan.locations.contains_key(&id) && node.op.is_view();
        if computed_here || view {
            stack.extend(graph.inputs_of(id));
        } else if graph.constant(id).is_some() {
            continue;
        } else if !graph.inputs().contains(&id)
            || graph.users_of(id).iter().any(|&u| matches!(graph.node(u).op, crate::ir::Op::Append { .. }))
        {
            return false;
        }
    }
    true
}

/// Blocks a batch × head: the most of 8, 4 and 2 that keep the launch within four blocks a
/// multiprocessor (GPT-2 small's 12 heads at batch 1: 8; 96 at batch 8: 4), else 1: a block's
/// keys go by in trips of 64 (for a 64-wide head), each a wait on memory, so fewer keys a block
/// is a shorter chain. `FUSEC_ATTENTION_CLUSTER` (1, 2, 4 or 8) overrides it, for measuring it.
fn cluster_size(heads: usize) -> usize {
    forced_cluster()
        .unwrap_or_else(|| [8, 4, 2].into_iter().find(|&c| heads * c <= 4 * MULTIPROCESSORS).unwrap_or(1))
}
