//! Angles and indices kept in f32 when a graph is lowered to f16. A rotary embedding's
//! `position × inverse frequency` rounded to f16 is off by up to `position × 2⁻¹¹` radians
//! (0.19 at position 384, ~1 near 2,000), so its cosines and sines — and every query and key
//! they turn — drift as a cache grows; and a float computation cast to an integer (T5's
//! relative-position buckets, `log(distance / exact) / log(max / exact) · buckets`) can land in
//! the next bucket when rounded to f16. PyTorch computes both in f32 whatever the model's type;
//! so does fusec's f16 policy: the sines and cosines, the casts to integers, and the f32 values
//! only they read (back to the positions and the constants) stay f32, the f16 values cast from
//! the sines' and cosines' results.

use std::collections::HashSet;

use crate::ir::{DType, Graph, NodeId, Op, UnaryOp};

/// The nodes the f16 policy keeps in f32: every `Sin` and `Cos` of an f32 value, every cast
/// of an f32 value to an integer type, and, walking back from them, each f32 value whose every
/// reader is already kept (constants included; graph inputs not). Graph outputs are not kept
/// (but for the casts, whose type stays), their type being the model's.
pub fn kept_in_f32(graph: &Graph) -> HashSet<NodeId> {
    let f32_value = |id: NodeId| graph.node(id).ty.dtype == DType::F32;
    let is_output = |id: NodeId| graph.outputs().iter().any(|(_, o)| *o == id);
    let mut kept: HashSet<NodeId> = graph
        .node_ids()
        .filter(|&id| match graph.node(id).op {
            Op::Unary(UnaryOp::Sin | UnaryOp::Cos) => f32_value(id) && !is_output(id),
            Op::Cast { to } => to.is_int(),
            _ => false,
        })
        .filter(|&id| f32_value(graph.inputs_of(id)[0]))
        .collect();
    let mut stack: Vec<NodeId> = kept.iter().copied().collect();
    while let Some(id) = stack.pop() {
        for input in graph.inputs_of(id) {
            let node = graph.node(input);
            let candidate = f32_value(input)
                && !kept.contains(&input)
                && !matches!(node.op, Op::Input { .. })
                && !is_output(input)
                && graph.users_of(input).iter().all(|u| kept.contains(u));
            if candidate {
                kept.insert(input);
                stack.push(input);
            }
        }
    }
    kept
}
