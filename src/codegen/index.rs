//! Index arithmetic as C expressions: coordinates of an element, and how they map through
//! views (reshape, transpose, slice, expand) back to the tensor that is stored in memory —
//! or forward, for a kernel that stores its result in a view's layout. Shapes are static, so
//! every divisor and stride is a literal the compiler folds.

use crate::ir::{Graph, NodeId, Op};

/// One C expression per dimension.
pub type Coords = Vec<String>;

/// Row-major linear index of `coords` in `shape`.
pub fn linearize(coords: &[String], shape: &[usize]) -> String {
    let mut terms = Vec::new();
    let mut stride = 1usize;
    for (c, &d) in coords.iter().zip(shape).rev() {
        if d != 1 && c != "0" {
            terms.push(if stride == 1 { c.clone() } else { format!("{c} * {stride}LL") });
        }
        stride *= d;
    }
    if terms.is_empty() {
        return "0".into();
    }
    terms.reverse();
    format!("({})", terms.join(" + "))
}

/// Coordinates in `shape` of row-major linear index `linear` (which is below the size).
pub fn delinearize(linear: &str, shape: &[usize]) -> Coords {
    let mut coords = Vec::with_capacity(shape.len());
    let mut stride: usize = shape.iter().product();
    for (i, &d) in shape.iter().enumerate() {
        stride /= d.max(1);
        coords.push(match (d, i, stride) {
            (1, _, _) => "0".to_string(),
            (_, 0, 1) => linear.to_string(),
            (_, 0, s) => format!("({linear} / {s}LL)"),
            (d, _, 1) => format!("({linear} % {d}LL)"),
            (d, _, s) => format!("(({linear} / {s}LL) % {d}LL)"),
        });
    }
    coords
}

/// Coordinates in shape `to` of the element at `coords` of shape `from` with the same linear
/// index (a reshape); `coords` themselves when the shapes are equal.
pub fn reshape_coords(coords: &[String], from: &[usize], to: &[usize]) -> Coords {
    if from == to {
        coords.to_vec()
    } else {
        delinearize(&linearize(coords, from), to)
    }
}

/// Coordinates of a `from`-shaped element in a `to`-shaped operand broadcast to it (numpy
/// rules: right-aligned, size-1 dimensions read index 0).
pub fn broadcast(coords: &[String], from: &[usize], to: &[usize]) -> Coords {
    (0..to.len())
        .map(|j| match (j + from.len()).checked_sub(to.len()) {
            Some(f) if to[j] != 1 => coords[f].clone(),
            _ => "0".to_string(),
        })
        .collect()
}

/// Whether `op` is a view: it moves no data, readers can index through it.
pub fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Expand { .. }
            | Op::Identity
            | Op::Dropout
    )
}

/// Maps coordinates of `id` back through views until `stored(id)`; returns that value and
/// its coordinates. `None` if a non-view op is reached first.
pub fn trace_back(
    graph: &Graph,
    mut id: NodeId,
    mut coords: Coords,
    stored: &dyn Fn(NodeId) -> bool,
) -> Option<(NodeId, Coords)> {
    loop {
        if stored(id) {
            return Some((id, coords));
        }
        let node = graph.node(id);
        let input = *graph.inputs_of(id).first()?;
        let in_shape = &graph.node(input).ty.shape;
        coords = match &node.op {
            Op::Reshape { shape } => delinearize(&linearize(&coords, shape), in_shape),
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
            Op::Expand { .. } => broadcast(&coords, &node.ty.shape, in_shape),
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
/// dims multiples of the pack, transposes that keep it last, slices starting on a multiple of
/// the pack and expands that do not broadcast it.
pub fn packs_along(
    graph: &Graph,
    mut id: NodeId,
    mut axis: usize,
    pack: usize,
    stored: &dyn Fn(NodeId) -> bool,
) -> bool {
    loop {
        let shape = &graph.node(id).ty.shape;
        let last = shape.len().wrapping_sub(1);
        if stored(id) {
            return axis == last && shape[last] % pack == 0;
        }
        let node = graph.node(id);
        let Some(&input) = graph.inputs_of(id).first() else { return false };
        let in_shape = &graph.node(input).ty.shape;
        axis = match &node.op {
            Op::Reshape { .. } => {
                let in_last = in_shape.len().wrapping_sub(1);
                let fits = axis == last
                    && shape[last] % pack == 0
                    && in_shape.get(in_last).is_some_and(|d| d % pack == 0);
                if !fits {
                    return false;
                }
                in_last
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
pub fn stores_pack_along(graph: &Graph, value: NodeId, view: NodeId, pack: usize) -> bool {
    let Some(chain) = view_chain(graph, value, view) else { return false };
    let shape = &graph.node(value).ty.shape;
    let Some(mut axis) = shape.len().checked_sub(1) else { return false };
    if shape[axis] % pack != 0 {
        return false;
    }
    for &v in chain.iter().rev() {
        let to = &graph.node(v).ty.shape;
        let last = to.len().wrapping_sub(1);
        axis = match &graph.node(v).op {
            Op::Reshape { .. } if to.get(last).is_some_and(|d| d % pack == 0) => last,
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
pub fn trace_forward(graph: &Graph, value: NodeId, view: NodeId, coords: Coords) -> Option<String> {
    let chain = view_chain(graph, value, view)?;
    let mut coords = coords;
    let mut shape = graph.node(value).ty.shape.clone();
    // Reshapes at the end of the chain keep the linear index as it is.
    let tail = chain.iter().take_while(|&&v| matches!(graph.node(v).op, Op::Reshape { .. })).count();
    for &v in chain[tail..].iter().rev() {
        let node = graph.node(v);
        coords = match &node.op {
            Op::Reshape { shape: to } => delinearize(&linearize(&coords, &shape), to),
            Op::Transpose { perm } => perm.iter().map(|&p| coords[p].clone()).collect(),
            _ => return None,
        };
        shape = node.ty.shape.clone();
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
        let coords = delinearize("i", &[2, 1, 3, 4]);
        assert_eq!(coords, ["(i / 12LL)", "0", "((i / 4LL) % 3LL)", "(i % 4LL)"]);
        assert_eq!(
            linearize(&coords, &[2, 1, 3, 4]),
            "((i / 12LL) * 12LL + ((i / 4LL) % 3LL) * 4LL + (i % 4LL))"
        );
        assert_eq!(broadcast(&["a".into(), "b".into(), "c".into()], &[2, 3, 4], &[3, 1]), ["b", "0"]);
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
        assert!(stores_pack_along(&g, x, r, 2));
        assert!(stores_pack_along(&g, x, r, 8));
        assert!(!stores_pack_along(&g, x, r, 16));
        assert!(stores_pack_along(&g, x, x, 4));
        let moved = g.add_op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[x], "m", origin).unwrap();
        assert!(!stores_pack_along(&g, x, moved, 2));
        // The reshapes at the end keep the linear index: no division by the view's dims.
        let index = trace_forward(&g, x, r, vec!["a".into(), "b".into(), "c".into(), "d".into()]).unwrap();
        assert_eq!(index, "(a * 96LL + c * 24LL + b * 8LL + d)");
    }
}
