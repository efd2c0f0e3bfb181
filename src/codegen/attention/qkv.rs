//! A decoding step's Q, K and V projection computed by the decoding attention kernel itself
//! (`templates/attention_decode.cu.hbs`, its `qkv` parts), where one sequence is decoded: the
//! blocks of a head's cluster each take a share of the head's columns of the product (runs of
//! 8), the norm before the product with them where the product's kernel could take it in,
//! and hand their results to every block of the cluster through distributed shared memory.
//! The product's step (and the norm's) are left out (`KernelSource::merges`): a step of
//! GPT-2 small loses a dependent kernel a layer. Where a batch of sequences is decoded, the
//! same match (`rows` above 1) feeds the batch's kernel (`super::rows`).

use serde_json::json;

use super::Problem;
use crate::codegen::kernel::Body;
use crate::codegen::skinny::norm_before;
use crate::codegen::{gemm, index::trace_back};
use crate::fusion::{Kernel, KernelKind};
use crate::ir::{DType, NodeId};
use crate::knobs;
use crate::plan::{Location, Plan};

/// The projection the kernel computes: the template's data and the steps it stands in for.
pub(super) struct Projection {
    pub data: serde_json::Value,
    pub merges: Vec<usize>,
    /// The C expressions of q at `d`, and of the new key and value's packs at `d` and `e`,
    /// read from where the kernel leaves them (its shared memory).
    pub q: String,
    pub k_pack: String,
    pub v_pack: String,
}

/// Where the kernel of `kernel` (the decoding attention, in clusters of `cluster` blocks a
/// head) can compute its q, k and v itself: they are views of one GEMM's output of one row
/// (one sequence) that nothing else reads, the GEMM's step right before this one, its weights
/// `[K, N]` and its epilogue a bias at most; `addresses` are q's, the new key's and the new
/// value's packs' addresses (at `d`, `d`, `e`), from which the kernel takes their columns.
/// Not in a program for ranges of sizes. `FUSEC_ATTENTION_QKV=0` leaves the product to its own
/// step, for measuring.
///
/// `rows` above 1: the product of a batch of sequences' rows, one a sequence
/// (`super::rows`), where the batch is the leading axis of q, the new key and the new value
/// and of the product's output (row b of the product is sequence b's), and a norm before it
/// has neither scale nor shift (folded into the weights).
pub(super) fn projection(
    body: &mut Body<'_>,
    kernel: &Kernel,
    problem: &Problem,
    cluster: usize,
    addresses: [&str; 3],
    rows: usize,
) -> Result<Option<Projection>, String> {
    let plan = body.plan;
    let graph = &plan.graph;
    if knobs::off("FUSEC_ATTENTION_QKV") || cluster < 2 || plan.symbolic.is_some() {
        return Ok(None);
    }
    let dtype = graph.node(problem.anchor).ty.dtype;
    // q, and the new key and value behind the appends, all views of one stored value.
    let new_of = |input: usize, key_axis: usize| {
        crate::fusion::append_behind(graph, problem.inputs[input], key_axis).map(|a| graph.inputs_of(a)[1])
    };
    let rank = problem.rank();
    let (Some(k_new), Some(v_new)) = (new_of(1, rank - 1), new_of(2, rank - 2)) else { return Ok(None) };
    let Some(c) = stored_behind(plan, kernel, problem.inputs[0]) else { return Ok(None) };
    if stored_behind(plan, kernel, k_new) != Some(c) || stored_behind(plan, kernel, v_new) != Some(c) {
        return Ok(None);
    }
    let Some(index) =
        plan.kernels.iter().position(|k| matches!(k.kind, KernelKind::Gemm { .. }) && k.outputs == [c])
    else {
        return Ok(None);
    };
    let product = &plan.kernels[index];
    let node = product.nodes[0];
    let Some(&out) = plan.locations.get(&c) else { return Ok(None) };
    let Ok(spec) = gemm::spec(plan, node, out) else { return Ok(None) };
    // Its epilogue: a bias at most (the ONNX Gemm's C, or an `Add` of a constant).
    let Some((bias, None)) = gemm::bias_and_residual(plan, product, node, &spec) else { return Ok(None) };
    let fits = spec.m == rows
        && spec.batch == 1
        && spec.alpha == 1.0
        && spec.dtype == dtype
        && spec.out.is_none()
        && spec.dims.is_none()
        && !spec.a.transposed
        && !spec.b.transposed
        && spec.n % 8 == 0
        && !product.kind.widens();
    if !fits || !read_here_alone(plan, kernel, c) {
        return Ok(None);
    }
    if rows > 1 {
        if !super::rows::fits(problem, spec.k, rows) {
            return Ok(None);
        }
        let leads = |id: NodeId| super::rows::batch_leads(plan, kernel, id, c, rows, spec.n);
        if !(leads(problem.inputs[0]) && leads(k_new) && leads(v_new)) {
            return Ok(None);
        }
    }
    // Right before this kernel (nothing runs between that reads what this one stores), with
    // what it reads kept live through this kernel by the plan.
    let next = plan.kernels.get(index + 1).filter(|k| std::ptr::eq(*k, kernel));
    if !next.is_some_and(|k| crate::plan::decoding_attention_after_gemm(graph, product, k)) {
        return Ok(None);
    }
    // The norm before the product (of a sum of two, which it stores), taken in where the
    // product's own kernel could take it; else A as stored.
    let norm = norm_before(plan, index, node, &spec);
    if rows > 1 && norm.as_ref().is_some_and(|n| n.gamma.is_some() || n.beta.is_some()) {
        return Ok(None);
    }
    let mut merges = vec![index];
    let x = match &norm {
        Some(n) => {
            merges.insert(0, n.step);
            n.x
        }
        None => spec.a.location,
    };
    let mut declare = |name: &str, location: Location| body.declare(name, location, dtype, false);
    declare("qkv_w", spec.b.location)?;
    declare("qkv_x", x)?;
    if let Some(b) = bias {
        declare("qkv_bias", b)?;
    }
    if let Some(n) = &norm {
        if let Some(gamma) = n.gamma {
            declare("qkv_gamma", gamma)?;
        }
        if let Some(beta) = n.beta {
            declare("qkv_beta", beta)?;
        }
        if let Some((y, _)) = n.sum {
            declare("qkv_y", y)?;
        }
    }
    let stored_sum = norm.and_then(|n| n.sum).and_then(|(_, h)| h);
    if let Some(h) = stored_sum {
        body.declare("qkv_h", h, dtype, true)?;
    }
    let base = body.pointer(c, false)?;
    let [q, k, v] = addresses.map(|a| format!("({a} - {base})"));
    let (depth, dv) = (problem.depth, problem.dv());
    let data = json!({
        "k": spec.k,
        "n": spec.n,
        "runs": (2 * depth + dv) / 8,
        "q_runs": depth / 8,
        "slots": 2 * depth + dv,
        "q_col": q,
        "k_col": k,
        "v_col": v,
        "bias": bias.is_some(),
        "norm": norm.map(|n| json!({
            "rms": n.rms && !n.deviation,
            "deviation": n.deviation,
            "gamma": n.gamma.is_some(),
            "beta": n.beta.is_some(),
            "sum": n.sum.is_some(),
            "store_sum": stored_sum.is_some(),
            "epsilon": crate::codegen::expr::literal(f64::from(n.epsilon), DType::F32),
        })),
    });
    Ok(Some(Projection {
        data,
        merges,
        q: "qkv_s[d]".into(),
        k_pack: format!("(qkv_s + {depth}LL + d)"),
        v_pack: format!("(qkv_s + {}LL + e)", 2 * depth),
    }))
}

/// The stored value `id` is a view of (itself where stored), through views only.
fn stored_behind(plan: &Plan, kernel: &Kernel, id: NodeId) -> Option<NodeId> {
    let graph = &plan.graph;
    let coords = vec!["0".to_string(); graph.node(id).ty.rank()];
    let stored = |n: NodeId| plan.locations.contains_key(&n) && !kernel.nodes.contains(&n);
    trace_back(graph, &|n| plan.dims(n), id, coords, &stored).map(|(n, _)| n)
}

/// Whether every reader of `c` (through views) is a node of `kernel`, and neither it nor a
/// view of it is an output of the program: then only this kernel needs its values.
fn read_here_alone(plan: &Plan, kernel: &Kernel, c: NodeId) -> bool {
    let graph = &plan.graph;
    let mut stack = vec![c];
    while let Some(id) = stack.pop() {
        if plan.outputs.iter().any(|b| b.value == id) {
            return false;
        }
        for user in graph.users_of(id) {
            let view = graph.node(user).op.is_view() && !plan.locations.contains_key(&user);
            match (view, kernel.nodes.contains(&user)) {
                (true, _) => stack.push(user),
                (false, true) => {}
                (false, false) => return false,
            }
        }
    }
    true
}
