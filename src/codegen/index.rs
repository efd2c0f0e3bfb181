//! Index arithmetic as C expressions: coordinates of an element, and how they map through
//! views (reshape, transpose, slice, expand) back to the tensor that is stored in memory —
//! or forward, for a kernel that stores its result in a view's layout. Static sizes are
//! literals the compiler folds; in a program for ranges of sizes, a size that follows a range
//! is an expression of the kernel's `fusec_d<i>` parameters ([`SymDim::c`]).

use crate::ir::SymDim;
use crate::ir::{Graph, NodeId, Op};

/// The shape of each value as index arithmetic sees it.
pub type ShapeOf<'a> = &'a dyn Fn(NodeId) -> Vec<SymDim>;

/// One C expression per dimension.
pub type Coords = Vec<String>;

/// A shape whose sizes may follow ranges of sizes: each a C expression once rendered.
pub type Dims = [SymDim];

/// Row-major linear index of `coords` in `shape`.
pub fn linearize(coords: &[String], shape: &Dims) -> String {
    let mut terms = Vec::new();
    let mut stride = SymDim::lit(1);
    for (c, d) in coords.iter().zip(shape).rev() {
        if !d.is_one() && c != "0" {
            terms.push(if stride.is_one() { c.clone() } else { format!("{c} * {}", stride.c()) });
        }
        stride = stride.mul(d);
    }
    if terms.is_empty() {
        return "0".into();
    }
    terms.reverse();
    format!("({})", terms.join(" + "))
}

/// Coordinates in `shape` of row-major linear index `linear` (which is below the size).
pub fn delinearize(linear: &str, shape: &Dims) -> Coords {
    // strides[i]: the product of the dims after i.
    let mut strides = vec![SymDim::lit(1); shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].mul(&shape[i + 1]);
    }
    shape
        .iter()
        .zip(&strides)
        .enumerate()
        .map(|(i, (d, s))| match (d.is_one(), i, s.is_one()) {
            (true, _, _) => "0".to_string(),
            (_, 0, true) => linear.to_string(),
            (_, 0, false) => format!("({linear} / {})", s.c()),
            (_, _, true) => format!("({linear} % {})", d.c()),
            _ => format!("(({linear} / {}) % {})", s.c(), d.c()),
        })
        .collect()
}

/// Coordinates in shape `to` of the element at `coords` of shape `from` with the same linear
/// index (a reshape); `coords` themselves when the shapes are equal. Dims are matched in
/// groups of equal size (`[b, s, 768]` to `[b, s, 12, 64]`: only the 768 is split), so that
/// no size is divided by that need not be (a run-time one, or one the compiler cannot see
/// through: `(b·s + t) / s` is not `b` unless t < s is known).
pub fn reshape_coords(coords: &[String], from: &Dims, to: &Dims) -> Coords {
    if from == to {
        return coords.to_vec();
    }
    match reshape_groups(from, to) {
        Some(groups) => groups
            .into_iter()
            .flat_map(|(f, t)| delinearize(&linearize(&coords[f.clone()], &from[f]), &to[t]))
            .collect(),
        None => delinearize(&linearize(coords, from), to),
    }
}

/// `from` and `to` cut into runs of dims of equal size, in order (each run of `from` is a
/// run of `to` reshaped); `None` where the sizes do not line up so.
fn reshape_groups(from: &Dims, to: &Dims) -> Option<Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>> {
    let (mut i, mut j) = (0, 0);
    let mut groups = Vec::new();
    while i < from.len() || j < to.len() {
        let (fi, tj) = (i, j);
        let mut a = SymDim::lit(1);
        let mut b = SymDim::lit(1);
        if i < from.len() {
            a = from[i].clone();
            i += 1;
        }
        if j < to.len() {
            b = to[j].clone();
            j += 1;
        }
        while a != b {
            if b.div(&a).is_some() && i < from.len() {
                a = a.mul(&from[i]);
                i += 1;
            } else if a.div(&b).is_some() && j < to.len() {
                b = b.mul(&to[j]);
                j += 1;
            } else {
                return None;
            }
        }
        groups.push((fi..i, tj..j));
    }
    Some(groups)
}

/// Coordinates of a `from`-shaped element in a `to`-shaped operand broadcast to it (numpy
/// rules: right-aligned, size-1 dimensions read index 0).
pub fn broadcast(coords: &[String], from: &Dims, to: &Dims) -> Coords {
    (0..to.len())
        .map(|j| match (j + from.len()).checked_sub(to.len()) {
            Some(f) if !to[j].is_one() => coords[f].clone(),
            _ => "0".to_string(),
        })
        .collect()
}

/// Maps coordinates of `id` back through views until `stored(id)`; returns that value and
/// its coordinates. `None` if a non-view op is reached first.
pub fn trace_back(
    graph: &Graph,
    dims: ShapeOf<'_>,
    mut id: NodeId,
    mut coords: Coords,
    stored: &dyn Fn(NodeId) -> bool,
) -> Option<(NodeId, Coords)> {
    loop {
        if stored(id) {
            return Some((id, coords));
        }
        let node = graph.node(id);
        let mut input = *graph.inputs_of(id).first()?;
        if let Op::Reshape { .. } = node.op {
            // Reshapes in a row are one reshape: the element's linear index is the same in all.
            while !stored(input)
                && matches!(graph.node(input).op, Op::Reshape { .. } | Op::Identity | Op::Dropout)
            {
                input = *graph.inputs_of(input).first()?;
            }
        }
        let in_shape = &dims(input);
        coords = match &node.op {
            Op::Reshape { .. } => reshape_coords(&coords, &dims(id), in_shape),
            Op::Transpose { perm } => {
                let mut inner = vec!["0".to_string(); perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inner[p] = coords[i].clone();
                }
                inner
            }
            Op::Slice { axes } => coords
                .iter()
                .zip(axes)
                .map(|(c, a)| match (a.start, a.step) {
                    (0, 1) => c.clone(),
                    (s, 1) => format!("({c} + {s}LL)"),
                    (s, step) => format!("({s}LL + ({step}LL) * {c})"),
                })
                .collect(),
            Op::Expand { .. } => broadcast(&coords, &dims(id), in_shape),
            Op::Identity | Op::Dropout => coords,
            _ => return None,
        };
        id = input;
    }
}

/// Whether `pack` consecutive elements of `id` along `axis`, from a multiple of `pack`, are
/// `pack` consecutive elements of the stored value behind its views, from a multiple of
/// `pack` of its linear index (so, in a buffer aligned to the pack, one aligned access).
/// The axis must end up the stored value's last, reached through reshapes that keep both last
/// dims multiples of the pack (where the axis is last) or keep the axis and every axis after
/// it as they are, transposes, slices starting on a multiple of the pack and expands that do
/// not broadcast it.
pub fn packs_along(
    graph: &Graph,
    dims: ShapeOf<'_>,
    mut id: NodeId,
    mut axis: usize,
    pack: usize,
    stored: &dyn Fn(NodeId) -> bool,
) -> bool {
    loop {
        let shape = &dims(id);
        let last = shape.len().wrapping_sub(1);
        if axis > last {
            return false;
        }
        if stored(id) {
            return axis == last && shape[last].divisible_by(pack);
        }
        let node = graph.node(id);
        let Some(&input) = graph.inputs_of(id).first() else { return false };
        let in_shape = &dims(input);
        axis = match &node.op {
            Op::Reshape { .. } => {
                let in_last = in_shape.len().wrapping_sub(1);
                // The axis and those after it as they are (only axes before them merged or
                // split): the same axis of the input, counted from the end.
                let from_end = shape.len() - axis;
                let same_tail =
                    in_shape.len() >= from_end && shape[axis..] == in_shape[in_shape.len() - from_end..];
                let fits = axis == last
                    && shape[last].divisible_by(pack)
                    && in_shape.get(in_last).is_some_and(|d| d.divisible_by(pack));
                match (same_tail, fits) {
                    (true, _) => in_shape.len() - from_end,
                    (false, true) => in_last,
                    (false, false) => return false,
                }
            }
            Op::Transpose { perm } => match perm.get(axis) {
                Some(&p) => p,
                None => return false,
            },
            Op::Slice { axes } => match axes.get(axis) {
                Some(a) if a.step == 1 && a.start % pack == 0 => axis,
                _ => return false,
            },
            Op::Expand { .. } => {
                let Some(a) = (axis + in_shape.len()).checked_sub(shape.len()) else { return false };
                if in_shape[a] != shape[axis] {
                    return false;
                }
                a
            }
            Op::Identity | Op::Dropout => axis,
            _ => return false,
        };
        id = input;
    }
}

/// The nodes from `view` back to `value` along first inputs, `view` first and `value` left
/// out (empty when they are the same); `None` if `value` is not reached.
fn view_chain(graph: &Graph, value: NodeId, view: NodeId) -> Option<Vec<NodeId>> {
    let mut chain = Vec::new();
    let mut at = view;
    while at != value {
        chain.push(at);
        at = *graph.inputs_of(at).first()?;
    }
    Some(chain)
}

/// Whether a kernel storing `value` in the layout of `view` (a chain of reshapes and
/// transposes of it, or `value` itself) writes `pack` consecutive elements of its last axis,
/// from a multiple of `pack`, as `pack` consecutive elements of `view`'s memory from a
/// multiple of `pack` (one aligned store in a buffer aligned to the pack). The last axis must
/// stay last through transposes, and reshapes must keep both last dims multiples of the pack.
pub fn stores_pack_along(graph: &Graph, dims: ShapeOf<'_>, value: NodeId, view: NodeId, pack: usize) -> bool {
    let Some(chain) = view_chain(graph, value, view) else { return false };
    let shape = &dims(value);
    let Some(mut axis) = shape.len().checked_sub(1) else { return false };
    if !shape[axis].divisible_by(pack) {
        return false;
    }
    for &v in chain.iter().rev() {
        let to = &dims(v);
        let last = to.len().wrapping_sub(1);
        axis = match &graph.node(v).op {
            Op::Reshape { .. } if to.get(last).is_some_and(|d| d.divisible_by(pack)) => last,
            Op::Transpose { perm } => match perm.iter().position(|&p| p == axis) {
                Some(a) => a,
                None => return false,
            },
            _ => return false,
        };
        if axis != last {
            return false;
        }
    }
    true
}

/// The linear index, in the layout of `view`, of `value`'s element at `coords`, where `view`
/// is a chain of reshapes and transposes of `value`.
pub fn trace_forward(
    graph: &Graph,
    dims: ShapeOf<'_>,
    value: NodeId,
    view: NodeId,
    coords: Coords,
) -> Option<String> {
    let chain = view_chain(graph, value, view)?;
    let mut coords = coords;
    let mut shape = dims(value);
    // Reshapes at the end of the chain keep the linear index as it is.
    let tail = chain.iter().take_while(|&&v| matches!(graph.node(v).op, Op::Reshape { .. })).count();
    for &v in chain[tail..].iter().rev() {
        let node = graph.node(v);
        coords = match &node.op {
            Op::Reshape { .. } => reshape_coords(&coords, &shape, &dims(v)),
            Op::Transpose { perm } => perm.iter().map(|&p| coords[p].clone()).collect(),
            _ => return None,
        };
        shape = dims(v);
    }
    Some(linearize(&coords, &shape))
}

/// Whether every index of `kernel` fits 32-bit arithmetic: it computes and reads only float
/// and bool values (so every `long long` and `LL` in its source is index arithmetic, never
/// data), and no tensor it touches, nor attention's virtual score matrix, nears 2^31
/// elements (where a tensor is in memory is a pointer parameter, never in the source).
/// 64-bit division and remainder cost many instructions; 32-bit ones a few.
pub fn fits_i32(plan: &crate::plan::Plan, kernel: &crate::fusion::Kernel) -> bool {
    let graph = &plan.graph;
    let limit = (i32::MAX / 4) as usize;
    let ok = |id: crate::ir::NodeId| {
        let ty = &graph.node(id).ty;
        !ty.dtype.is_int() && ty.len() < limit
    };
    kernel.nodes.iter().all(|&n| {
        let inputs = graph.inputs_of(n);
        let scores_fit = match graph.node(n).op {
            Op::Attention { .. } => {
                let keys = graph.node(inputs[1]).ty.shape.last().copied().unwrap_or(1);
                graph.node(n).ty.len() / graph.node(n).ty.shape.last().copied().unwrap_or(1).max(1) * keys
                    < limit
            }
            _ => true,
        };
        ok(n) && inputs.into_iter().all(ok) && scores_fit
    })
}

/// `source` with 32-bit index arithmetic: `long long` becomes `int` and the `LL` suffix of
/// integer literals goes. Only for kernels [`fits_i32`] accepts.
pub fn narrow(source: &str) -> String {
    let text = source.replace("long long", "int");
    let chars: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() && (i == 0 || !ident(chars[i - 1])) {
            while i < chars.len() && chars[i].is_ascii_digit() {
                out.push(chars[i]);
                i += 1;
            }
            let suffix = chars.get(i) == Some(&'L')
                && chars.get(i + 1) == Some(&'L')
                && !chars.get(i + 2).is_some_and(|&c| ident(c));
            if suffix {
                i += 2;
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_indices_round_trip() {
        let coords = delinearize("i", &SymDim::lits(&[2, 1, 3, 4]));
        assert_eq!(coords, ["(i / 12LL)", "0", "((i / 4LL) % 3LL)", "(i % 4LL)"]);
        assert_eq!(
            linearize(&coords, &SymDim::lits(&[2, 1, 3, 4])),
            "((i / 12LL) * 12LL + ((i / 4LL) % 3LL) * 4LL + (i % 4LL))"
        );
        let b = broadcast(
            &["a".into(), "b".into(), "c".into()],
            &SymDim::lits(&[2, 3, 4]),
            &SymDim::lits(&[3, 1]),
        );
        assert_eq!(b, ["b", "0"]);
    }

    /// `[batch, seq, 12, 64]` with both dims given ranges: strides and divisors that follow
    /// them are expressions of the kernel's parameters; the leading axis is never divided by.
    #[test]
    fn sizes_that_follow_ranges_are_parameters() {
        let shape = [SymDim::new(1, vec![1]), SymDim::new(1, vec![0, 1]), SymDim::lit(12), SymDim::lit(64)];
        let coords = delinearize("i", &shape);
        assert_eq!(
            coords,
            ["(i / (768LL * fusec_d1))", "((i / 768LL) % fusec_d1)", "((i / 64LL) % 12LL)", "(i % 64LL)"]
        );
        assert_eq!(
            linearize(&["a".into(), "b".into(), "c".into(), "d".into()], &shape),
            "(a * (768LL * fusec_d1) + b * 768LL + c * 64LL + d)"
        );
        assert_eq!(SymDim::new(2, vec![1, 2]).c(), "(2LL * fusec_d0 * fusec_d1 * fusec_d1)");
        // A reshape splits only the dims whose sizes differ; the run-time ones stay as they are.
        let heads = [SymDim::new(1, vec![1]), SymDim::new(1, vec![0, 1]), SymDim::lit(768)];
        let split = reshape_coords(&["a".into(), "b".into(), "c".into()], &heads, &shape);
        assert_eq!(split, ["(a)", "(b)", "((c) / 64LL)", "((c) % 64LL)"]);
        let rows = [SymDim::new(1, vec![1, 1]), SymDim::lit(768)];
        let back = reshape_coords(&["r".into(), "c".into()], &rows, &heads);
        assert_eq!(back, ["((r) / fusec_d1)", "((r) % fusec_d1)", "(c)"]);
    }

    /// A key cache `[b, heads, t, d]` read as `[b, heads, d, t]` in packs along `d`: through one
    /// transpose (the TorchScript exporter) or a reshape to three dims, a transpose and a
    /// reshape back (the dynamo exporter), where `d` is the stored last axis; not along an
    /// axis a reshape merges with another, nor along the key axis.
    #[test]
    fn packs_follow_reshapes_that_keep_the_axis_and_those_after_it() {
        use crate::ir::{DType, Origin, TensorType};
        let mut g = Graph::new();
        let x = g.add_input("cache", TensorType::new(DType::F16, vec![1, 4, 17, 16]));
        let origin = Origin::new("k", "test");
        let op = |g: &mut Graph, op: Op, input: NodeId| g.add_op(op, &[input], "k", origin.clone()).unwrap();
        let one = op(&mut g, Op::Transpose { perm: vec![0, 1, 3, 2] }, x);
        let three = op(&mut g, Op::Reshape { shape: vec![4, 17, 16] }, x);
        let turned = op(&mut g, Op::Transpose { perm: vec![0, 2, 1] }, three);
        let back = op(&mut g, Op::Reshape { shape: vec![1, 4, 16, 17] }, turned);
        let merged = op(&mut g, Op::Reshape { shape: vec![1, 68, 16] }, x);
        let split = op(&mut g, Op::Reshape { shape: vec![2, 2, 17, 16] }, three);
        let dims = |id: NodeId| SymDim::lits(&g.node(id).ty.shape);
        let stored = |id: NodeId| id == x;
        assert!(packs_along(&g, &dims, one, 2, 8, &stored));
        assert!(packs_along(&g, &dims, back, 2, 8, &stored));
        assert!(!packs_along(&g, &dims, back, 2, 32, &stored));
        assert!(!packs_along(&g, &dims, back, 3, 8, &stored));
        assert!(!packs_along(&g, &dims, merged, 1, 8, &stored));
        assert!(!packs_along(&g, &dims, split, 2, 8, &stored));
        assert!(packs_along(&g, &dims, split, 3, 8, &stored));
    }

    /// Attention's output stored as [batch, seq, heads·depth] through a transpose that keeps
    /// the last axis last: pairs along it are adjacent; a transpose that moves it is not.
    #[test]
    fn stores_pack_only_where_the_last_axis_stays_last() {
        use crate::ir::{DType, Origin, TensorType};
        let mut g = Graph::new();
        let x = g.add_input("x", TensorType::new(DType::F16, vec![2, 3, 4, 8]));
        let origin = Origin::new("t", "test");
        let t = g.add_op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[x], "t", origin.clone()).unwrap();
        let r = g.add_op(Op::Reshape { shape: vec![2, 4, 24] }, &[t], "r", origin.clone()).unwrap();
        let moved = g.add_op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[x], "m", origin).unwrap();
        let dims = |id: NodeId| SymDim::lits(&g.node(id).ty.shape);
        assert!(stores_pack_along(&g, &dims, x, r, 2));
        assert!(stores_pack_along(&g, &dims, x, r, 8));
        assert!(!stores_pack_along(&g, &dims, x, r, 16));
        assert!(stores_pack_along(&g, &dims, x, x, 4));
        assert!(!stores_pack_along(&g, &dims, x, moved, 2));
        // The reshapes at the end keep the linear index: no division by the view's dims.
        let index =
            trace_forward(&g, &dims, x, r, vec!["a".into(), "b".into(), "c".into(), "d".into()]).unwrap();
        assert_eq!(index, "(a * 96LL + c * 24LL + b * 8LL + d)");
    }
}
