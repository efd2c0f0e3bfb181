//! Common-subexpression elimination: two nodes with the same op on the same inputs become
//! one; so do two small constants with equal values.

use std::collections::HashMap;

use super::Pass;
use crate::ir::{Graph, IrError, NodeId, Op};

/// Common-subexpression elimination: of nodes with the same op and inputs, one is kept.
pub struct Cse;

/// Constants with more elements than this are not compared (weights are rarely duplicated,
/// and comparing them costs a pass over every weight).
const MAX_COMPARED_CONSTANT: usize = 64;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut seen: HashMap<String, NodeId> = HashMap::new();
        let mut merged = 0;
        for id in graph.topo_order()? {
            let node = graph.node(id);
            let key = match &node.op {
                Op::Input { .. } => continue,
                Op::Constant(t) if t.len() > MAX_COMPARED_CONSTANT => continue,
                Op::Constant(t) => format!(
                    "const {} {:?}",
                    node.ty,
                    t.to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                ),
                op => format!("{op} {:?}", graph.inputs_of(id)),
            };
            match seen.get(&key) {
                Some(&first) => {
                    // The kept node stands for the ONNX nodes of both.
                    let names: Vec<String> = graph.node(id).origin.onnx_nodes().map(String::from).collect();
                    graph.node_mut(first).origin.absorb(names);
                    graph.replace_uses(id, first);
                    graph.remove_node(id);
                    merged += 1;
                }
                None => {
                    seen.insert(key, id);
                }
            }
        }
        Ok(merged)
    }
}
