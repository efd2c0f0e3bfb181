//! The verifier, run after import and after every pass: the graph is acyclic, every node has
//! its inputs in slots 0..n with an arity its op accepts, every node's type is what its op
//! infers from its inputs' types, and the graph's inputs and outputs are in the graph.

use super::error::IrError;
use super::graph::Graph;
use super::op::Op;

/// Checks the graph as the module says; the error names the first node that fails.
pub fn verify(graph: &Graph) -> Result<(), IrError> {
    graph.topo_order()?;
    let fail = |node: &str, message: String| IrError::Verify { node: node.to_string(), message };
    for id in graph.node_ids() {
        let node = graph.node(id);
        let name = &node.origin.node;
        let slots = graph.input_slots(id);
        if slots.iter().enumerate().any(|(i, &s)| i != s) {
            return Err(fail(name, format!("input slots {slots:?} are not 0..{}", slots.len())));
        }
        if let Op::Input { .. } = node.op {
            if !graph.inputs().contains(&id) {
                return Err(fail(name, "an Input node that is not a graph input".into()));
            }
            continue;
        }
        let inferred = graph.infer(&node.op, &graph.inputs_of(id)).map_err(|m| fail(name, m))?;
        if inferred != node.ty {
            return Err(fail(
                name,
                format!("stored type {} but {} infers {inferred}", node.ty, node.op.kind()),
            ));
        }
    }
    for &id in graph.inputs() {
        if !graph.contains(id) || !matches!(graph.node(id).op, Op::Input { .. }) {
            return Err(fail("<inputs>", format!("graph input {id:?} is not an Input node")));
        }
    }
    for (name, id) in graph.outputs() {
        if !graph.contains(*id) {
            return Err(fail(name, "graph output refers to a removed node".into()));
        }
    }
    Ok(())
}
