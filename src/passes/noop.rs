//! Removes ops that return their input unchanged: a `Cast` to the same type, a `Reshape` or
//! `Expand` to the same shape, an identity `Transpose`, a `Slice` that keeps everything, a
//! `Concat` of one input.
//! (`Identity` and `Dropout` are left to fusion, which accounts for them.)

use super::Pass;
use crate::ir::{Graph, IrError, Node, Op};

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

impl Pass for RemoveNoops {
    fn name(&self) -> &'static str {
        "remove-noops"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut removed = 0;
        for id in graph.topo_order()? {
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
