//! A deterministic text form of a graph, for golden tests and `--dump`. Values are numbered
//! in topological order; constants print their type, and small ones their values.

use std::collections::HashMap;
use std::fmt::Write;

use super::dtype::DType;
use super::error::IrError;
use super::graph::{Graph, NodeId};
use super::op::Op;

/// Constants with at most this many elements print their values.
const INLINE_CONSTANT_ELEMENTS: usize = 8;

/// The graph as deterministic text: one line per node in topological order.
pub fn dump(graph: &Graph) -> Result<String, IrError> {
    let order = graph.topo_order()?;
    let numbers: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut out = String::new();
    for &id in &order {
        let node = graph.node(id);
        let args: Vec<String> = graph.inputs_of(id).iter().map(|i| format!("%{}", numbers[i])).collect();
        let body = match &node.op {
            Op::Constant(t) if t.len() <= INLINE_CONSTANT_ELEMENTS => {
                let values: Vec<String> = match t.dtype() {
                    // Print in the tensor's own precision: 1e-5, not 0.0000099999997….
                    DType::F32 | DType::F16 | DType::BF16 => {
                        t.to_f64_vec().iter().map(|&v| (v as f32).to_string()).collect()
                    }
                    _ => t.to_f64_vec().iter().map(|v| v.to_string()).collect(),
                };
                format!("Constant [{}]", values.join(", "))
            }
            Op::Constant(_) => format!("Constant \"{}\"", node.name),
            op @ Op::Input { .. } => op.to_string(),
            op => format!("{op}({})", args.join(", ")),
        };
        let _ = writeln!(out, "%{} = {body} : {}", numbers[&id], node.ty);
    }
    for (name, id) in graph.outputs() {
        let _ = writeln!(out, "output \"{name}\" = %{}", numbers[id]);
    }
    Ok(out)
}
