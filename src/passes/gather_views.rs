//! Replaces a `GatherND` whose constant indices only re-address its data — each index
//! component equal to one output coordinate, in order — by the view it is: a `Reshape` that
//! inserts the output's other axes with size 1, then an `Expand` where they are wider. The
//! dynamo exporter builds padding masks this way (`mask[arange(b)[:, None, None, None],
//! arange(k)]`); as views they fuse with the mask arithmetic around them. Likewise a `Gather`
//! whose constant indices are `0, 1, …, n-1` in order along an axis of size n only splits that
//! axis: it becomes a `Reshape` (the TorchScript exporter's padding mask gathers the flattened
//! mask at `b·seq + s`). A `Gather` of one constant position is a `Slice` of that position
//! (then a `Reshape` dropping the axis where the index is a scalar): PyTorch's multi-head
//! attention picks its Q, K and V from the packed projection this way (`proj[0]`), and as
//! views they are read in place by the attention kernel rather than copied out.

use super::Pass;
use crate::ir::{Graph, IrError, NodeId, Op, SliceAxis, Tensor};

/// Turns a GatherND whose constant indices only re-address its data into Reshape/Expand views,
/// and a Gather of every position of an axis in order into a Reshape.
pub struct GatherNdViews;

/// Index tensors larger than this are not inspected (real masks are far smaller).
const MOST_INDICES: usize = 1 << 22;

/// Index `v` of an axis of `size`, a negative one counted from the end.
fn from_end(v: i64, size: usize) -> i64 {
    if v < 0 {
        v + size as i64
    } else {
        v
    }
}

/// The output axis each index component copies, in increasing order, when component `t` at
/// every position equals the position's coordinate on one output axis of the data's size.
fn copied_axes(indices: &Tensor, data_shape: &[usize]) -> Option<Vec<usize>> {
    let shape = indices.shape();
    let (&depth, rows) = shape.split_last()?;
    if indices.len() > MOST_INDICES || depth > data_shape.len() {
        return None;
    }
    let values = indices.to_i64_vec();
    let count: usize = rows.iter().product();
    // Row-major strides of the index rows' axes: position `p` is at `p / stride[a] % rows[a]`
    // on axis `a`.
    let stride: Vec<usize> = (0..rows.len()).map(|a| rows[a + 1..].iter().product()).collect();
    let mut axes: Vec<usize> = Vec::with_capacity(depth);
    for (t, &size) in data_shape.iter().enumerate().take(depth) {
        let start = axes.last().map_or(0, |a| a + 1);
        let axis = (start..rows.len()).find(|&a| {
            rows[a] == size
                && (0..count).all(|p| {
                    let v = values[p * depth + t];
                    let v = from_end(v, size);
                    v == (p / stride[a] % size) as i64
                })
        })?;
        axes.push(axis);
    }
    Some(axes)
}

/// Whether `indices` are 0, 1, …, `size` - 1 in row-major order (negative ones counted from
/// the end).
fn in_order(indices: &Tensor, size: usize) -> bool {
    indices.len() == size
        && size <= MOST_INDICES
        && indices.to_i64_vec().iter().enumerate().all(|(p, &v)| {
            let v = from_end(v, size);
            v == p as i64
        })
}

/// Replaces `id` by `Reshape(data)` to its own shape, then `Expand` to `out_shape` where
/// `reshaped` differs from it.
fn replace_by_view(graph: &mut Graph, id: NodeId, data: NodeId, reshaped: Vec<usize>) -> Result<(), IrError> {
    let node = graph.node(id);
    let (out_shape, name, origin) = (node.ty.shape.clone(), node.name.clone(), node.origin.clone());
    let mut view = graph.add_op(Op::Reshape { shape: reshaped.clone() }, &[data], &name, origin.clone())?;
    if reshaped != out_shape {
        view = graph.add_op(Op::Expand { shape: out_shape }, &[view], &name, origin)?;
    }
    graph.replace_uses(id, view);
    graph.remove_node(id);
    Ok(())
}

/// Replaces Gather `id` of the one position `at` along `axis` of `data` by a `Slice` of it,
/// reshaped to the gather's shape.
fn replace_by_slice(
    graph: &mut Graph,
    id: NodeId,
    data: NodeId,
    axis: usize,
    at: usize,
) -> Result<(), IrError> {
    let node = graph.node(id);
    let (out_shape, name, origin) = (node.ty.shape.clone(), node.name.clone(), node.origin.clone());
    let mut axes: Vec<SliceAxis> =
        graph.node(data).ty.shape.iter().map(|&len| SliceAxis { start: 0, step: 1, len }).collect();
    axes[axis] = SliceAxis { start: at, step: 1, len: 1 };
    let slice = graph.add_op(Op::Slice { axes }, &[data], &format!("{name}/slice"), origin.clone())?;
    let view = graph.add_op(Op::Reshape { shape: out_shape }, &[slice], &name, origin)?;
    graph.replace_uses(id, view);
    graph.remove_node(id);
    Ok(())
}

/// The one position a Gather's constant indices take along an axis of size `size`, if they
/// hold one that is in range (negative ones counted from the end).
fn one_position(indices: &Tensor, size: usize) -> Option<usize> {
    let [v] = indices.to_i64_vec()[..] else { return None };
    let v = from_end(v, size);
    (0..size as i64).contains(&v).then_some(v as usize)
}

impl Pass for GatherNdViews {
    fn name(&self) -> &'static str {
        "gathernd-views"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut changed = 0;
        for id in graph.topo_order()? {
            let inputs: Vec<NodeId> = graph.inputs_of(id);
            let [data, indices] = inputs[..] else { continue };
            let Some(index_values) = graph.constant(indices).cloned() else { continue };
            let data_shape = graph.node(data).ty.shape.clone();
            let reshaped = match graph.node(id).op {
                Op::GatherNd { batch_dims: 0 } => {
                    let Some(axes) = copied_axes(&index_values, &data_shape) else { continue };
                    let rows = index_values.shape().len() - 1;
                    let mut reshaped: Vec<usize> = (0..rows)
                        .map(|r| axes.iter().position(|&a| a == r).map_or(1, |t| data_shape[t]))
                        .collect();
                    reshaped.extend_from_slice(&data_shape[axes.len()..]);
                    reshaped
                }
                Op::Gather { axis }
                    if axis < data_shape.len() && in_order(&index_values, data_shape[axis]) =>
                {
                    let mut reshaped = data_shape[..axis].to_vec();
                    reshaped.extend_from_slice(index_values.shape());
                    reshaped.extend_from_slice(&data_shape[axis + 1..]);
                    reshaped
                }
                Op::Gather { axis } if axis < data_shape.len() && index_values.len() == 1 => {
                    let Some(at) = one_position(&index_values, data_shape[axis]) else { continue };
                    replace_by_slice(graph, id, data, axis, at)?;
                    changed += 1;
                    continue;
                }
                _ => continue,
            };
            replace_by_view(graph, id, data, reshaped)?;
            changed += 1;
        }
        Ok(changed)
    }
}
