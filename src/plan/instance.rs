//! A program for ranges of sizes at one point of them: what a bundle computes there, for
//! the CPU reference evaluator, and the constants as the plan stores them.

use super::{Location, Plan};
use crate::ir::{Graph, NodeId, Op, SymbolicShapes, Tensor};

impl Plan {
    /// The program of `plan` (planned at the top of the ranges) with the symbols at `values`:
    /// every shape evaluated, the shapes ops carry (reshape and expand targets, slice lengths,
    /// tile counts) set to match, and each constant cut to its leading part there — what a
    /// bundle for the ranges computes at that point, for the CPU reference evaluator
    /// ([`crate::ir::evaluate`]) to run. The error names the first node that cannot be.
    pub fn instantiate(&self, symbolic: &SymbolicShapes, values: &[usize]) -> Result<Graph, String> {
        let plan = self;
        let mut graph = plan.graph.clone();
        let ids: Vec<NodeId> = graph.node_ids().collect();
        for id in ids {
            let name = graph.node(id).name.clone();
            let shape = symbolic.eval(id, values).ok_or_else(|| format!("'{name}': its shape overflows"))?;
            if shape.len() != graph.node(id).ty.rank() {
                return Err(format!("'{name}' has no symbolic shape"));
            }
            let input_shape = graph.inputs_of(id).first().and_then(|&i| symbolic.eval(i, values));
            let constant = match graph.node(id).op {
                Op::Constant(_) => Some(
                    plan.constant_value(id)
                        .and_then(|top| top.leading_part(&shape))
                        .ok_or_else(|| format!("constant '{name}' has no leading part of shape {shape:?}"))?,
                ),
                _ => None,
            };
            let node = graph.node_mut(id);
            match &mut node.op {
                Op::Reshape { shape: to } | Op::Expand { shape: to } => *to = shape.clone(),
                Op::Slice { axes } => {
                    for (a, d) in axes.iter_mut().zip(&shape) {
                        a.len = *d;
                    }
                }
                Op::Tile { repeats } => {
                    let input = input_shape.ok_or_else(|| format!("'{name}': a tile without an input"))?;
                    *repeats = shape.iter().zip(&input).map(|(o, i)| o / (*i).max(1)).collect();
                }
                Op::Constant(value) => {
                    if let Some(c) = constant {
                        *value = std::sync::Arc::new(c);
                    }
                }
                _ => {}
            }
            node.ty.shape = shape;
        }
        Ok(graph)
    }

    /// A constant's values as the plan stores them (in the weights, or still in the graph).
    pub fn constant_value(&self, id: NodeId) -> Option<Tensor> {
        let plan = self;
        if let Some(value) =
            plan.graph.constant(id).filter(|t| !t.is_empty() || plan.graph.node(id).ty.is_empty())
        {
            return Some((**value).clone());
        }
        let ty = &plan.graph.node(id).ty;
        let Location::Weights(offset) = *plan.locations.get(&id)? else { return None };
        let bytes = plan.weights.get(offset..offset + ty.size_bytes())?;
        Tensor::from_le_bytes(bytes, &ty.shape, ty.dtype)
    }
}
