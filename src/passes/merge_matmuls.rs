//! Horizontal GEMM merging: MatMuls that share their left operand and multiply it by constant
//! matrices (attention's Q, K and V projections) become one MatMul by the concatenated
//! weights, followed by one bias add if each had a constant bias, and a `Slice` per original
//! output. One wide GEMM replaces several narrow ones; the slices are views.

use std::sync::Arc;

use super::{Pass, SharedConstants};
use crate::ir::ops::layout;
use crate::ir::{BinaryOp, Graph, IrError, NodeId, Op, Origin, SliceAxis, Tensor};

/// Merges MatMuls that share their left operand into one over concatenated weights (Q, K and V
/// projections become one GEMM), sliced after. The concatenations are made through the
/// shared constants where given: the same weights merged at several sizes are held once.
#[derive(Default)]
pub struct MergeSiblingMatMuls<'s> {
    shared: Option<&'s SharedConstants>,
}

impl<'s> MergeSiblingMatMuls<'s> {
    /// The pass, its concatenations made through `shared` where given.
    pub fn sharing(shared: Option<&'s SharedConstants>) -> Self {
        MergeSiblingMatMuls { shared }
    }
}

/// One MatMul to merge: the node, its constant weight `[K, N]`, and its bias add if any.
struct Sibling {
    matmul: NodeId,
    weight: Arc<Tensor>,
    bias: Option<(NodeId, Arc<Tensor>)>,
}

/// The constant bias `[N]` added to `matmul`, if its one user is such an add.
fn bias_of(graph: &Graph, matmul: NodeId, n: usize) -> Option<(NodeId, Arc<Tensor>)> {
    let [add] = graph.users_of(matmul)[..] else { return None };
    if graph.node(add).op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let inputs = graph.inputs_of(add);
    let other = if inputs[0] == matmul { inputs[1] } else { inputs[0] };
    let bias = graph.constant(other)?;
    (bias.shape() == [n] && inputs.iter().filter(|&&i| i == matmul).count() == 1).then(|| (add, bias.clone()))
}

fn siblings(graph: &Graph, lhs: NodeId) -> Vec<Sibling> {
    let dtype = graph.node(lhs).ty.dtype;
    let mut found: Vec<Sibling> = graph
        .users_of(lhs)
        .into_iter()
        .filter(|&u| graph.node(u).op == Op::MatMul)
        .filter_map(|u| {
            let inputs = graph.inputs_of(u);
            let weight = graph.constant(inputs[1])?;
            (inputs[0] == lhs && inputs[1] != lhs && weight.shape().len() == 2 && weight.dtype() == dtype)
                .then(|| Sibling { matmul: u, weight: weight.clone(), bias: None })
        })
        .collect();
    for s in &mut found {
        s.bias = bias_of(graph, s.matmul, s.weight.shape()[1]);
    }
    found
}

/// `parts` concatenated along their last axis, through `shared` where given.
fn concat_last(shared: Option<&SharedConstants>, parts: &[&Arc<Tensor>]) -> Result<Arc<Tensor>, String> {
    SharedConstants::derive_or_make(shared, "concat last", parts, || {
        let tensors: Vec<&Tensor> = parts.iter().map(|p| p.as_ref()).collect();
        layout::eval_concat(&tensors, tensors[0].shape().len() - 1)
    })
}

impl Pass for MergeSiblingMatMuls<'_> {
    fn name(&self) -> &'static str {
        "merge-sibling-matmuls"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut merged = 0;
        for lhs in graph.topo_order()? {
            if !graph.contains(lhs) {
                continue;
            }
            let group = siblings(graph, lhs);
            if group.len() < 2 {
                continue;
            }
            let first = graph.node(group[0].matmul).origin.clone();
            let fail =
                |message: String| IrError::Op { node: first.node.clone(), op: "MatMul".into(), message };
            let weights: Vec<&Arc<Tensor>> = group.iter().map(|s| &s.weight).collect();
            let weight = concat_last(self.shared, &weights).map_err(fail)?;
            let mut origin = first.clone();
            for s in &group[1..] {
                origin.merged.extend(graph.node(s.matmul).origin.onnx_nodes().map(String::from));
            }
            let name = format!("{}_merged", graph.node(group[0].matmul).name);
            let w = graph.add_constant(&format!("{name}_weight"), weight, origin.clone());
            let mut out = graph.add_op(Op::MatMul, &[lhs, w], &name, origin.clone())?;
            let with_bias = group.iter().all(|s| s.bias.is_some());
            if with_bias {
                let biases: Vec<&Arc<Tensor>> =
                    group.iter().filter_map(|s| s.bias.as_ref().map(|b| &b.1)).collect();
                let bias = concat_last(self.shared, &biases).map_err(fail)?;
                let mut bias_origin = origin.clone();
                bias_origin.merged.extend(
                    group.iter().filter_map(|s| s.bias.as_ref()).flat_map(|b| {
                        graph.node(b.0).origin.onnx_nodes().map(String::from).collect::<Vec<_>>()
                    }),
                );
                let b = graph.add_constant(&format!("{name}_bias"), bias, bias_origin.clone());
                out = graph.add_op(
                    Op::Binary(BinaryOp::Add),
                    &[out, b],
                    &format!("{name}_biased"),
                    bias_origin,
                )?;
            }
            let shape = graph.node(out).ty.shape.clone();
            let last = shape.len() - 1;
            let mut start = 0;
            for s in &group {
                let n = s.weight.shape()[1];
                let mut axes: Vec<SliceAxis> =
                    shape.iter().map(|&len| SliceAxis { start: 0, step: 1, len }).collect();
                axes[last] = SliceAxis { start, step: 1, len: n };
                start += n;
                let replaced = match (&s.bias, with_bias) {
                    (Some((add, _)), true) => *add,
                    _ => s.matmul,
                };
                let node = graph.node(replaced);
                let (slice_name, slice_origin) =
                    (node.name.clone(), Origin::new(node.origin.node.clone(), "Slice"));
                let slice = graph.add_op(Op::Slice { axes }, &[out], &slice_name, slice_origin)?;
                graph.replace_uses(replaced, slice);
                graph.remove_node(replaced);
                if replaced != s.matmul {
                    graph.remove_node(s.matmul);
                }
            }
            merged += group.len();
        }
        Ok(merged)
    }
}
