//! A deterministic text form of a graph, for golden tests and `--dump`. Values are numbered
//! in topological order; constants print their type, and small ones their values.

use std::collections::HashMap;
use std::fmt::Write;

use super::error::IrError;
use super::graph::{Graph, NodeId};
use super::op::Op;

/// Constants with at most this many elements print their values.
const INLINE_CONSTANT_ELEMENTS: usize = 8;

pub fn dump(graph: &Graph) -> Result<String, IrError> {
    let order = graph.topo_order()?;
    let numbers: HashMap<NodeId, usize> =
        order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut out = String::new();
    for &id in &order {
        let node = graph.node(id);
        let args: Vec<String> = graph
            .inputs_of(id)
            .iter()
            .map(|i| format!("%{}", numbers[i]))
            .collect();
        let body = match &node.op {
            Op::Constant(t) if t.len() <= INLINE_CONSTANT_ELEMENTS => {
                let values: Vec<String> = t.to_f64_vec().iter().map(|v| format!("{v}")).collect();
                format!("Constant [{}]", values.join(", "))
            }
            op => format!("{op}({})", args.join(", ")),
        };
        let _ = writeln!(out, "%{} = {body} : {}", numbers[&id], node.ty);
    }
    for (name, id) in graph.outputs() {
        let _ = writeln!(out, "output \"{name}\" = %{}", numbers[id]);
    }
    Ok(out)
}
