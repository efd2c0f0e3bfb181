//! Lowers a graph's f32 computation to f16 or bf16: weights are stored in the target type, every
//! f32 value becomes the target type, and the graph keeps f32 at its boundary (a cast after
//! each f32 input, one before each f32 output). Run after fusion, so that rules compare the
//! model's own f32 constants. Kernels accumulate reductions in f32 whatever the storage type.

use std::collections::HashMap;
use std::sync::Arc;

use crate::ir::{DType, Graph, IrError, NodeId, Op, Origin};

/// The graph in `target` precision, and where each old node went.
pub fn lower_precision(graph: &Graph, target: DType) -> Result<(Graph, HashMap<NodeId, NodeId>), IrError> {
    let mut out = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let convert = |d: DType| if d == DType::F32 { target } else { d };
    for &input in graph.inputs() {
        let node = graph.node(input);
        let id = out.add_input(&node.name, node.ty.clone());
        let id = if node.ty.dtype == DType::F32 {
            let origin = Origin::new(&node.name, "Cast");
            out.add_op(Op::Cast { to: target }, &[id], &format!("{}_{}", node.name, target), origin)?
        } else {
            id
        };
        map.insert(input, id);
    }
    for id in graph.topo_order()? {
        if map.contains_key(&id) {
            continue;
        }
        let node = graph.node(id);
        let new = match &node.op {
            Op::Constant(value) if value.dtype() == DType::F32 => {
                out.add_constant(&node.name, Arc::new(value.cast(target)), node.origin.clone())
            }
            Op::Constant(value) => out.add_constant(&node.name, value.clone(), node.origin.clone()),
            op => {
                let op = match op {
                    Op::Cast { to } => Op::Cast { to: convert(*to) },
                    other => other.clone(),
                };
                let inputs: Vec<NodeId> = graph.inputs_of(id).iter().map(|i| map[i]).collect();
                out.add_op(op, &inputs, &node.name, node.origin.clone())?
            }
        };
        map.insert(id, new);
    }
    let mut outputs = Vec::new();
    for (name, id) in graph.outputs() {
        let new = map[id];
        let new = if graph.node(*id).ty.dtype == DType::F32 {
            out.add_op(
                Op::Cast { to: DType::F32 },
                &[new],
                &format!("{name}_f32"),
                Origin::new(name, "Cast"),
            )?
        } else {
            new
        };
        outputs.push((name.clone(), new));
    }
    out.set_outputs(outputs);
    crate::ir::verify(&out)?;
    Ok((out, map))
}
