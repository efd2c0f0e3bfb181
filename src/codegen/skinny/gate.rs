//! A gated MLP's product (Llama's `down(silu(gate(x)) · up(x))`) with its gate computed where
//! the kernel for a few rows reads A: the pointwise kernel before it — `g · σ(g) · u` of the
//! two halves of the merged gate-and-up product — is left out of the step when that kernel
//! runs, one launch a layer fewer. Each block computes its rows' gates once into shared
//! memory and its warps read them there (computed where each warp reads A, the kernel was
//! compute-bound: the Llama-style decoder's step at batch 1 went 0.217 → 0.280 ms a token on an
//! H200; this way 0.219 → 0.204). `FUSEC_SKINNY_GATE=0` (at compile time) keeps the gate apart.

use crate::fusion::KernelKind;
use crate::ir::{BinaryOp, NodeId, Op, UnaryOp};
use crate::knobs;
use crate::plan::{Location, Plan};

use super::super::gemm::GemmSpec;

/// A as `x · σ(x) · y`, `x` and `y` read where the kernel before the pointwise one stored them
/// (rows `stride` elements apart: the two halves of one `[M, 2K]` product).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gate {
    /// The step of the pointwise kernel the GEMM's kernel stands in for.
    pub step: usize,
    /// The first element of `x`.
    pub x: Location,
    /// The first element of `y`.
    pub y: Location,
    /// Elements from one row of `x` (and of `y`) to the next.
    pub stride: usize,
}

/// `location` moved `bytes` on.
fn offset(location: Location, bytes: usize) -> Location {
    match location {
        Location::Arena(o) => Location::Arena(o + bytes),
        Location::Weights(o) => Location::Weights(o + bytes),
    }
}

/// Where value `id` (`[.., K]`, `m` rows of `k`) starts and its row stride: a stored value of
/// `k` columns, or a slice of the last axis (step 1, every other axis whole) of a stored value,
/// through reshapes that keep the last axis.
fn rows_of(plan: &Plan, mut id: NodeId, m: usize, k: usize, bytes: usize) -> Option<(Location, usize)> {
    let graph = &plan.graph;
    let mut start = 0;
    let mut sliced = false;
    loop {
        let node = graph.node(id);
        if let Some(&location) = plan.locations.get(&id) {
            let shape = &node.ty.shape;
            let width = *shape.last()?;
            let rows: usize = shape[..shape.len() - 1].iter().product();
            let fits = rows == m && (sliced || width == k) && start + k <= width;
            return fits.then(|| (offset(location, start * bytes), width));
        }
        let input = *graph.inputs_of(id).first()?;
        let inner = &graph.node(input).ty.shape;
        match &node.op {
            Op::Reshape { .. } | Op::Identity if inner.last() == node.ty.shape.last() => {}
            Op::Slice { axes } if !sliced && axes.len() == inner.len() => {
                let (last, rest) = axes.split_last()?;
                let whole = rest.iter().zip(inner).all(|(a, &d)| a.start == 0 && a.step == 1 && a.len == d);
                if !whole || last.step != 1 || last.len != k {
                    return None;
                }
                start = last.start;
                sliced = true;
            }
            _ => return None,
        }
        id = input;
    }
}

/// The gate kernel `index − 1` where the GEMM of kernel `index` (node `gemm`, spec `g`) can
/// compute it as it reads A: a pointwise kernel of exactly `σ(x)`, `x · σ(x)` and that times
/// `y` (either order), its one output read by this GEMM alone (as A, through reshapes), `x`
/// and `y` stored rows (or slices of their last axis) of the GEMM's element type that the
/// GEMM's output does not overlap. `None` with `FUSEC_SKINNY_GATE=0`.
pub fn gate_before(plan: &Plan, index: usize, gemm: NodeId, g: &GemmSpec) -> Option<Gate> {
    if knobs::off("FUSEC_SKINNY_GATE") {
        return None;
    }
    let graph = &plan.graph;
    let before = plan.kernels.get(index.checked_sub(1)?)?;
    let view = |id: NodeId| graph.node(id).op.is_view();
    let computed: Vec<NodeId> = before.nodes.iter().copied().filter(|&id| !view(id)).collect();
    let [sigmoid, silu, gated] = computed[..] else { return None };
    if before.kind != KernelKind::Pointwise || before.outputs != [gated] || !before.store_views.is_empty() {
        return None;
    }
    let other = |node: NodeId, known: NodeId| -> Option<NodeId> {
        match graph.inputs_of(node)[..] {
            [a, b] if a == known => Some(b),
            [a, b] if b == known => Some(a),
            _ => None,
        }
    };
    let mul = |id: NodeId| graph.node(id).op == Op::Binary(BinaryOp::Mul);
    if graph.node(sigmoid).op != Op::Unary(UnaryOp::Sigmoid) || !mul(silu) || !mul(gated) {
        return None;
    }
    let x = graph.inputs_of(sigmoid)[0];
    let y = other(gated, silu)?;
    if other(silu, sigmoid)? != x || y == silu {
        return None;
    }
    // The gate reaches the GEMM as its A, through views read by nothing else.
    let mut a = graph.inputs_of(gemm)[0];
    while a != gated {
        if !matches!(graph.node(a).op, Op::Reshape { .. } | Op::Identity) || graph.users_of(a).len() != 1 {
            return None;
        }
        a = graph.inputs_of(a)[0];
    }
    let read_once = graph.users_of(gated).len() == 1 && plan.outputs.iter().all(|b| b.value != gated);
    let typed = [x, y, gated].iter().all(|&id| graph.node(id).ty.dtype == g.dtype);
    if !read_once || !typed {
        return None;
    }
    let bytes = g.dtype.size_bytes();
    let ((x_at, stride), (y_at, y_stride)) =
        (rows_of(plan, x, g.m, g.k, bytes)?, rows_of(plan, y, g.m, g.k, bytes)?);
    if stride != y_stride {
        return None;
    }
    // Nothing read is written: the GEMM's output overlaps neither operand's rows (each `K`
    // elements, `stride` apart: the last row ends `K` elements after its start, so `y`'s
    // last row ends where the merged product does, not a half-row past it).
    let (out, span) = (g.m * g.n * bytes, (g.m.checked_sub(1)? * stride + g.k) * bytes);
    if [x_at, y_at].into_iter().any(|at| super::overlaps(at, span, g.c, out)) {
        return None;
    }
    Some(Gate { step: index - 1, x: x_at, y: y_at, stride })
}
