//! A reduction over several axes as one reduction per axis, innermost first: a global pool
//! over NCHW (`axes = [2, 3]`) becomes a row reduction over the width (a block per row) and a
//! short one over the height; over NHWC (`axes = [1, 2]`), a reduction over the width for
//! each row of the image (threads side by side along the channels) and one over the rows.
//! A reduction over several axes is otherwise one thread per output looping over all of its
//! elements: a [8, 32, 112, 112] pool is 256 threads of 12,544 reads each.
//!
//! Exact in real arithmetic for sums, maxima and means (every partial mean averages as many
//! elements); the order of the additions changes.

use super::Pass;
use crate::ir::{Graph, IrError, NodeId, Op};

/// Reductions over several axes split into one per axis.
pub struct SplitReductions;

impl Pass for SplitReductions {
    fn name(&self) -> &'static str {
        "split-reductions"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut changed = 0;
        for id in graph.topo_order()? {
            changed += usize::from(split(graph, id)?);
        }
        Ok(changed)
    }
}

fn split(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Reduce { op, axes, keep_dims } = &node.op else { return Ok(false) };
    if axes.len() < 2 {
        return Ok(false);
    }
    let mut order = axes.clone();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut value = graph.inputs_of(id)[0];
    for (k, &axis) in order.iter().enumerate() {
        let last = k + 1 == order.len() && *keep_dims;
        let name = if last { node.name.clone() } else { format!("{}/axis{axis}", node.name) };
        let reduce = Op::Reduce { op: *op, axes: vec![axis], keep_dims: true };
        value = graph.add_op(reduce, &[value], &name, node.origin.clone())?;
    }
    if !*keep_dims {
        let shape = node.ty.shape.clone();
        value = graph.add_op(Op::Reshape { shape }, &[value], &node.name, node.origin.clone())?;
    }
    graph.replace_uses(id, value);
    graph.remove_node(id);
    Ok(true)
}
