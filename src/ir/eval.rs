//! The CPU reference evaluator: runs a whole graph on host tensors. It defines what every
//! transformation must preserve, and tests compare it with tract and with the GPU.

use std::collections::HashMap;

use super::error::IrError;
use super::graph::Graph;
use super::op::Op;
use super::ops;
use super::tensor::Tensor;

/// Runs `graph` on `feeds` (by input name) and returns its outputs in order, with names.
pub fn evaluate(graph: &Graph, feeds: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, IrError> {
    let expected = || {
        graph
            .inputs()
            .iter()
            .map(|&i| format!("{} {}", graph.node(i).name, graph.node(i).ty))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for name in feeds.keys() {
        if !graph.inputs().iter().any(|&i| &graph.node(i).name == name) {
            return Err(IrError::UnknownInput { name: name.clone(), expected: expected() });
        }
    }
    let mut values: HashMap<_, Tensor> = HashMap::new();
    for id in graph.topo_order()? {
        let node = graph.node(id);
        let value = match &node.op {
            Op::Input { name } => {
                let fed = feeds
                    .get(name)
                    .ok_or_else(|| IrError::MissingInput { name: name.clone(), expected: expected() })?;
                if fed.tensor_type() != node.ty {
                    return Err(IrError::InputType {
                        name: name.clone(),
                        expected: node.ty.to_string(),
                        got: fed.tensor_type().to_string(),
                    });
                }
                fed.clone()
            }
            op => {
                let inputs = graph.inputs_of(id);
                let args: Vec<&Tensor> = inputs.iter().map(|i| &values[i]).collect();
                ops::evaluate(op, &args).map_err(|message| IrError::Op {
                    node: node.origin.node.clone(),
                    op: op.kind(),
                    message,
                })?
            }
        };
        values.insert(id, value);
    }
    Ok(graph.outputs().iter().map(|(name, id)| (name.clone(), values[id].clone())).collect())
}
