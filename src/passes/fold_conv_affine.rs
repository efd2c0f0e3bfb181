//! Folds a per-channel scale or shift of a convolution's output into the convolution:
//! `Conv(x, W, b) · k` becomes `Conv(x, W·k, b·k)` and `Conv(x, W, b) + k` becomes
//! `Conv(x, W, b + k)`, where `k` is a constant with one value per output channel (or one
//! value). Inference BatchNormalization is imported as such a scale and shift, so a
//! convolution and its normalisation become one convolution with new weights.

use std::sync::Arc;

use ndarray::{ArrayD, Axis, IxDyn};

use super::Pass;
use crate::ir::{BinaryOp, Graph, IrError, NodeId, Op, Tensor};

/// Folds per-channel scales and shifts into the convolution before them.
pub struct FoldConvAffine;

/// The value per output channel of constant `k` against a convolution output of
/// `channels` channels and rank 4, if `k` broadcasts that way (one value, or `[C, 1, 1]`,
/// `[1, C, 1, 1]`, …).
fn per_channel(k: &Tensor, channels: usize) -> Option<Vec<f64>> {
    let shape = k.shape();
    if shape.len() > 4 {
        return None;
    }
    let mut padded = vec![1; 4 - shape.len()];
    padded.extend_from_slice(shape);
    if padded[0] != 1 || padded[2] != 1 || padded[3] != 1 || (padded[1] != 1 && padded[1] != channels) {
        return None;
    }
    let values = k.to_f64_vec();
    Some(if values.len() == 1 { vec![values[0]; channels] } else { values })
}

impl Pass for FoldConvAffine {
    fn name(&self) -> &'static str {
        "fold-conv-affine"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut folded = 0;
        for id in graph.topo_order()? {
            if !graph.contains(id) {
                continue;
            }
            let op = match graph.node(id).op {
                Op::Binary(op @ (BinaryOp::Mul | BinaryOp::Add)) => op,
                _ => continue,
            };
            let inputs = graph.inputs_of(id);
            let [a, b] = inputs.as_slice() else { continue };
            let (conv, k) = match (&graph.node(*a).op, &graph.node(*b).op) {
                (Op::Conv { .. }, _) if graph.constant(*b).is_some() => (*a, *b),
                (_, Op::Conv { .. }) if graph.constant(*a).is_some() => (*b, *a),
                _ => continue,
            };
            // The convolution's value must be needed only here, and the op must not broadcast
            // it to a larger shape.
            let only_here = graph.users_of(conv) == [id] && !graph.outputs().iter().any(|(_, o)| *o == conv);
            if !only_here || graph.node(id).ty != graph.node(conv).ty {
                continue;
            }
            let Some(replacement) = folded_conv(graph, conv, k, op)? else { continue };
            graph.replace_uses(id, replacement);
            let merged = graph.node(id).origin.onnx_nodes().map(String::from).collect::<Vec<_>>();
            graph.node_mut(replacement).origin.merged.extend(merged);
            graph.remove_node(id);
            graph.remove_node(conv);
            folded += 1;
        }
        Ok(folded)
    }
}

/// A new convolution computing `conv op k`, if its weights and bias are constants and `k`
/// is per channel.
fn folded_conv(graph: &mut Graph, conv: NodeId, k: NodeId, op: BinaryOp) -> Result<Option<NodeId>, IrError> {
    let inputs = graph.inputs_of(conv);
    let node = graph.node(conv).clone();
    let channels = node.ty.shape[1];
    let (Some(weights), Some(k)) = (graph.constant(inputs[1]), graph.constant(k)) else { return Ok(None) };
    let Some(k) = per_channel(k, channels) else { return Ok(None) };
    let bias = match inputs.get(2) {
        Some(&b) => match graph.constant(b) {
            Some(bias) => Some(bias.to_f64_vec()),
            None => return Ok(None),
        },
        None => None,
    };
    let dtype = weights.dtype();
    let mut new_inputs = vec![inputs[0]];
    let (weights, bias) = match op {
        BinaryOp::Mul => {
            let mut w: ArrayD<f64> = weights.to_f64();
            for (co, mut filter) in w.axis_iter_mut(Axis(0)).enumerate() {
                filter.mapv_inplace(|v| v * k[co]);
            }
            (
                Tensor::from_f64(w, dtype),
                bias.map(|b| b.iter().zip(&k).map(|(b, k)| b * k).collect::<Vec<_>>()),
            )
        }
        _ => {
            let b = bias.unwrap_or_else(|| vec![0.0; channels]);
            ((**weights).clone(), Some(b.iter().zip(&k).map(|(b, k)| b + k).collect()))
        }
    };
    let origin = node.origin.clone();
    new_inputs.push(graph.add_constant(&format!("{}/weights", node.name), Arc::new(weights), origin.clone()));
    if let Some(b) = bias {
        let b = ArrayD::from_shape_vec(IxDyn(&[channels]), b).map_err(|e| IrError::Op {
            node: node.name.clone(),
            op: node.op.kind(),
            message: e.to_string(),
        })?;
        new_inputs.push(graph.add_constant(
            &format!("{}/bias", node.name),
            Arc::new(Tensor::from_f64(b, dtype)),
            origin.clone(),
        ));
    }
    graph.add_op(node.op.clone(), &new_inputs, &node.name, origin).map(Some)
}
