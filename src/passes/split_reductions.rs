//! A reduction over several axes as one reduction per axis, innermost first: over NHWC's
//! spatial axes (`axes = [1, 2]`, a global pool) a reduction over the width for each row of
//! the image (threads side by side along the channels) and one over the rows. Over the last
//! axes (a global pool over NCHW, `axes = [2, 3]`) the reduction is one over their run, a row
//! reduction over `H·W` elements read through a reshape: split, it was a block per row of
//! the image and its width alone (MobileNetV3-Large's f32 pools at batch 32 took 0.13–0.36 ms
//! each that way, on an H200).
//! A reduction over several axes is otherwise one thread per output looping over all of its
//! elements: a [8, 32, 112, 112] pool is 256 threads of 12,544 reads each.
//!
//! Exact in real arithmetic for sums, maxima and means (every partial mean averages as many
//! elements); the order of the additions changes.

use super::Pass;
use crate::ir::{Graph, IrError, NodeId, Op};

/// A reduction over the last axes is one over their run where it has at least this many rows
/// (a block each)…
const TRAILING_ROWS: usize = 64;
/// …or runs of at most this many elements: a few very long rows would leave most of the GPU
/// idle, one block a row, where the split form spreads the first stage over many blocks. (A
/// guard by reasoning, not measured: the pools measured had 72 to 30,720 rows.)
const TRAILING_RUN: usize = 8192;

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
    let input = graph.inputs_of(id)[0];
    let shape = graph.node(input).ty.shape.clone();
    let rank = shape.len();
    let lead = rank.saturating_sub(order.len());
    let (rows, run) = (shape[..lead].iter().product::<usize>(), shape[lead..].iter().product::<usize>());
    let fills = rows >= TRAILING_ROWS || run <= TRAILING_RUN;
    if fills && order.iter().enumerate().all(|(k, &axis)| axis + 1 + k == rank) {
        return trailing(graph, id, input, order.len());
    }
    let mut value = input;
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

/// Reduction `id` over the last `count` axes of `input` as one over their run: `input`
/// reshaped to its leading axes and the run's length, reduced over the last axis, reshaped to
/// the reduction's shape.
fn trailing(graph: &mut Graph, id: NodeId, input: NodeId, count: usize) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Reduce { op, .. } = node.op else { return Ok(false) };
    let shape = graph.node(input).ty.shape.clone();
    let lead = shape.len() - count;
    let mut rows = shape[..lead].to_vec();
    rows.push(shape[lead..].iter().product());
    let name = |what: &str| format!("{}/{what}", node.name);
    let flat = graph.add_op(Op::Reshape { shape: rows }, &[input], &name("rows"), node.origin.clone())?;
    let reduce = Op::Reduce { op, axes: vec![lead], keep_dims: true };
    let reduced = graph.add_op(reduce, &[flat], &name("run"), node.origin.clone())?;
    let shape = node.ty.shape.clone();
    let value = graph.add_op(Op::Reshape { shape }, &[reduced], &node.name, node.origin.clone())?;
    graph.replace_uses(id, value);
    graph.remove_node(id);
    Ok(true)
}
