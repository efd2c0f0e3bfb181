//! Removes ops that return their input unchanged: a `Cast` to the same type, a `Reshape` or
//! `Expand` to the same shape, an identity `Transpose`, a `Slice` that keeps everything, a
//! `Concat` of one input, an `Add` of zeros (a constant or a broadcast view of one: PyTorch
//! initialises attention's projection biases to zeros, and a GEMM whose bias add reads such a
//! view could not take it into its epilogue), and a `Gemm`'s C of zeros (the GEMM then needs
//! no epilogue kernel).
//! (`Identity` and `Dropout` are left to fusion, which accounts for them.)

use super::Pass;
use crate::ir::{BinaryOp, Graph, IrError, Node, NodeId, Op};

/// Removes ops that return their input unchanged (the module's list).
pub struct RemoveNoops;

fn is_noop(op: &Op, input: &Node) -> bool {
    match op {
        Op::Cast { to } => *to == input.ty.dtype,
        Op::Reshape { shape } | Op::Expand { shape } => *shape == input.ty.shape,
        Op::Concat { .. } => true,
        Op::Transpose { perm } => perm.iter().enumerate().all(|(i, &p)| i == p),
        Op::Slice { axes } => {
            axes.iter().zip(&input.ty.shape).all(|(a, &d)| a.start == 0 && a.step == 1 && a.len == d)
        }
        _ => false,
    }
}

/// Constants larger than this are not read for zeros (biases are far smaller).
const MOST_READ: usize = 1 << 16;

/// The views (`Expand`, `Reshape`) from `id` down to a constant holding only zeros, `id`
/// first, if that is what `id` is (empty where `id` is that constant).
pub(super) fn zero_views(graph: &Graph, mut id: NodeId) -> Option<Vec<NodeId>> {
    let mut views = Vec::new();
    loop {
        match &graph.node(id).op {
            Op::Expand { .. } | Op::Reshape { .. } => {
                views.push(id);
                id = graph.inputs_of(id)[0];
            }
            Op::Constant(value) => {
                let zeros = !value.is_empty()
                    && value.len() <= MOST_READ
                    && value.to_f64_vec().iter().all(|&v| v == 0.0);
                return zeros.then_some(views);
            }
            _ => return None,
        }
    }
}

/// The ONNX names of `views`, which a node that no longer reads them stands for.
fn names_of(graph: &Graph, views: &[NodeId]) -> Vec<String> {
    views.iter().flat_map(|&v| graph.node(v).origin.onnx_nodes().map(String::from)).collect()
}

/// Where `id` is an `Add` of zeros to an operand of its own type: that operand, and the views
/// of the zeros.
fn added_to_zeros(graph: &Graph, id: NodeId) -> Option<(NodeId, Vec<NodeId>)> {
    if graph.node(id).op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let inputs = graph.inputs_of(id);
    let [a, b] = inputs[..] else { return None };
    let ty = &graph.node(id).ty;
    [(a, b), (b, a)]
        .into_iter()
        .filter(|&(kept, _)| graph.node(kept).ty == *ty)
        .find_map(|(kept, other)| Some((kept, zero_views(graph, other)?)))
}

/// A `Gemm` whose C holds only zeros (its beta finite): the same `Gemm` without C.
fn drop_zero_c(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id);
    let Op::Gemm { beta, .. } = node.op else { return Ok(false) };
    let inputs = graph.inputs_of(id);
    if inputs.len() != 3 || !beta.is_finite() {
        return Ok(false);
    }
    let Some(views) = zero_views(graph, inputs[2]) else { return Ok(false) };
    let node = graph.node(id);
    let (op, name, mut origin) = (node.op.clone(), node.name.clone(), node.origin.clone());
    origin.absorb(names_of(graph, &views));
    let new = graph.add_op(op, &inputs[..2], &name, origin)?;
    graph.replace_uses(id, new);
    graph.remove_node(id);
    Ok(true)
}

impl Pass for RemoveNoops {
    fn name(&self) -> &'static str {
        "remove-noops"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut removed = 0;
        for id in graph.topo_order()? {
            if drop_zero_c(graph, id)? {
                removed += 1;
                continue;
            }
            if let Some((kept, views)) = added_to_zeros(graph, id) {
                // The kept value stands for the ONNX nodes of the add and of the zeros' views
                // (the kernel that computes it reports them).
                let names =
                    names_of(graph, &[id]).into_iter().chain(names_of(graph, &views)).collect::<Vec<_>>();
                graph.node_mut(kept).origin.absorb(names);
                graph.replace_uses(id, kept);
                graph.remove_node(id);
                removed += 1;
                continue;
            }
            let inputs = graph.inputs_of(id);
            let [input] = inputs.as_slice() else { continue };
            let node = graph.node(id);
            if node.ty == graph.node(*input).ty && is_noop(&node.op, graph.node(*input)) {
                graph.replace_uses(id, *input);
                graph.remove_node(id);
                removed += 1;
            }
        }
        Ok(removed)
    }
}
