//! Channels-last layout for convolutions: each convolution cuDNN runs on tensor cores (the
//! same padding at both ends, constant filters) becomes an NHWC convolution between two
//! transposes, `T(conv_nhwc(T(x)))`, with its filters stored KRSC. The transposes are then
//! moved past the pointwise ops after each convolution (a per-channel constant is permuted
//! with them) and a transpose that meets its inverse cancels: between two convolutions of a
//! network the activations stay NHWC, and only the graph's input and the values other ops
//! read are transposed, by the kernels that write or read them.

use std::sync::Arc;

use super::Pass;
use crate::ir::{ops, Graph, IrError, NodeId, Op};

/// NCHW to NHWC.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
/// NHWC to NCHW.
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];

/// Convolutions to NHWC, and the transposes between them cancelled.
pub struct ChannelsLast;

impl Pass for ChannelsLast {
    fn name(&self) -> &'static str {
        "channels-last"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut changed = 0;
        for id in graph.topo_order()? {
            changed += usize::from(to_nhwc(graph, id)?);
        }
        if changed == 0 {
            return Ok(0);
        }
        // Each round moves transposes one pointwise op further and cancels the pairs that
        // meet; a network is done in about as many rounds as the longest chain between two
        // convolutions.
        for _ in 0..256 {
            let mut moved = 0;
            for id in graph.topo_order()? {
                if !graph.contains(id) {
                    continue;
                }
                moved += usize::from(sink(graph, id)? || cancel(graph, id)?);
            }
            changed += moved;
            if moved == 0 {
                break;
            }
        }
        graph.remove_unused();
        Ok(changed)
    }
}

fn op_error(graph: &Graph, id: NodeId, message: String) -> IrError {
    let node = graph.node(id);
    IrError::Op { node: node.origin.node.clone(), op: node.op.kind(), message }
}

/// Rewrites convolution `id` as `T(conv_nhwc(T(x), W in KRSC))`, if it is one cuDNN takes.
fn to_nhwc(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Conv { strides, pads, dilations, group, channels_last: false } = node.op else {
        return Ok(false);
    };
    let inputs = graph.inputs_of(id);
    let symmetric = pads[0] == pads[2] && pads[1] == pads[3];
    let Some(filters) = graph.constant(inputs[1]).cloned() else { return Ok(false) };
    if !symmetric || node.ty.rank() != 4 {
        return Ok(false);
    }
    let krsc = ops::evaluate(&Op::Transpose { perm: TO_NHWC.to_vec() }, &[&filters])
        .map_err(|m| op_error(graph, id, m))?;
    let origin = node.origin.clone();
    let x = graph.add_op(
        Op::Transpose { perm: TO_NHWC.to_vec() },
        &[inputs[0]],
        &format!("{}/input_nhwc", node.name),
        origin.clone(),
    )?;
    let w = graph.add_constant(&format!("{}/krsc", node.name), Arc::new(krsc), origin.clone());
    let mut conv_inputs = vec![x, w];
    conv_inputs.extend(inputs.get(2));
    let conv = Op::Conv { strides, pads, dilations, group, channels_last: true };
    let conv = graph.add_op(conv, &conv_inputs, &format!("{}/nhwc", node.name), origin.clone())?;
    let back = graph.add_op(Op::Transpose { perm: TO_NCHW.to_vec() }, &[conv], &node.name, origin)?;
    graph.replace_uses(id, back);
    graph.remove_node(id);
    Ok(true)
}

fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// Moves the transposes feeding pointwise op `id` past it: `p(T(a, P), k)` becomes
/// `T(p(a, k'), P)`, with every constant `k` permuted to `a`'s layout. Only where every
/// non-constant input is a transpose by the same permutation of a value of `id`'s shape.
fn sink(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    if !node.op.is_pointwise() || node.ty.rank() != 4 {
        return Ok(false);
    }
    let inputs = graph.inputs_of(id);
    let mut perm: Option<Vec<usize>> = None;
    for &i in &inputs {
        match &graph.node(i).op {
            Op::Transpose { perm: p } if graph.node(i).ty.shape == node.ty.shape => {
                if perm.as_ref().is_some_and(|q| q != p) {
                    return Ok(false);
                }
                perm = Some(p.clone());
            }
            Op::Constant(value) if value.shape().len() <= 4 => {}
            _ => return Ok(false),
        }
    }
    let Some(perm) = perm else { return Ok(false) };
    let inv = inverse(&perm);
    let mut moved = Vec::with_capacity(inputs.len());
    for &i in &inputs {
        let input = match graph.constant(i) {
            Some(value) => {
                let mut shape = vec![1; 4 - value.shape().len()];
                shape.extend_from_slice(value.shape());
                let reshaped =
                    ops::evaluate(&Op::Reshape { shape }, &[value]).map_err(|m| op_error(graph, id, m))?;
                let permuted = ops::evaluate(&Op::Transpose { perm: inv.clone() }, &[&reshaped])
                    .map_err(|m| op_error(graph, id, m))?;
                let name = format!("{}/{}", node.name, graph.node(i).name);
                graph.add_constant(&name, Arc::new(permuted), graph.node(i).origin.clone())
            }
            None => graph.inputs_of(i)[0],
        };
        moved.push(input);
    }
    let inner =
        graph.add_op(node.op.clone(), &moved, &format!("{}/moved", node.name), node.origin.clone())?;
    let outer = graph.add_op(Op::Transpose { perm }, &[inner], &node.name, node.origin.clone())?;
    graph.replace_uses(id, outer);
    graph.remove_node(id);
    Ok(true)
}

/// `T(T(a, P1), P2)` as one transpose, or `a` where the two cancel.
fn cancel(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let Op::Transpose { perm: outer } = &graph.node(id).op else { return Ok(false) };
    let inputs = graph.inputs_of(id);
    let Op::Transpose { perm: inner } = &graph.node(inputs[0]).op else { return Ok(false) };
    let composed: Vec<usize> = outer.iter().map(|&o| inner[o]).collect();
    let source = graph.inputs_of(inputs[0])[0];
    let replacement = if composed.iter().enumerate().all(|(i, &p)| i == p) {
        source
    } else {
        let node = graph.node(id).clone();
        graph.add_op(Op::Transpose { perm: composed }, &[source], &node.name, node.origin)?
    };
    graph.replace_uses(id, replacement);
    graph.remove_node(id);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::inverse;

    #[test]
    fn inverse_permutations_compose_to_the_identity() {
        for perm in [[0, 2, 3, 1], [0, 3, 1, 2], [3, 2, 1, 0]] {
            let inv = inverse(&perm);
            assert!((0..4).all(|i| perm[inv[i]] == i && inv[perm[i]] == i));
        }
    }
}
