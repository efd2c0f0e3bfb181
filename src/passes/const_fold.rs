//! Constant folding: a node whose inputs are all constants becomes a constant.

use std::sync::Arc;

use super::Pass;
use crate::ir::{ops, Graph, IrError, Op, Tensor};

/// Evaluates every op whose inputs are all constants and puts the result in its place.
pub struct ConstFold;

impl Pass for ConstFold {
    fn name(&self) -> &'static str {
        "const-fold"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut folded = 0;
        for id in graph.topo_order()? {
            let node = graph.node(id);
            if matches!(node.op, Op::Input { .. } | Op::Constant(_)) {
                continue;
            }
            let inputs = graph.inputs_of(id);
            // A small constant expanded to a large one stays a view
            // ([`crate::ir::UNIFORM_ELEMENTS`]).
            let kept_expanded = matches!(node.op, Op::Expand { .. })
                && (node.ty.dtype.is_float() || node.ty.dtype == crate::ir::DType::Bool)
                && node.ty.len() >= crate::ir::UNIFORM_ELEMENTS
                && graph.constant(inputs[0]).is_some_and(|c| c.len() < node.ty.len());
            if kept_expanded {
                continue;
            }
            let Some(values) = inputs.iter().map(|&i| graph.constant(i)).collect::<Option<Vec<_>>>() else {
                continue;
            };
            let args: Vec<&Tensor> = values.iter().map(|t| t.as_ref()).collect();
            let value = ops::evaluate(&node.op, &args).map_err(|message| IrError::Op {
                node: node.origin.node.clone(),
                op: node.op.kind(),
                message,
            })?;
            let (name, origin) = (node.name.clone(), node.origin.clone());
            let constant = graph.add_constant(&name, Arc::new(value), origin);
            graph.replace_uses(id, constant);
            graph.remove_node(id);
            folded += 1;
        }
        Ok(folded)
    }
}
