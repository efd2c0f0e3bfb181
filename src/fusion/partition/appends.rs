//! Appends to caches updated in place that share one shape (a decoder layer's keys and
//! values) in one kernel, and that kernel in its attention's where the decoding kernel runs it.

use super::Builder;
use crate::ir::{DType, Graph, NodeId, Op};
use crate::knobs;

impl Builder<'_> {
    /// Each append to a cache in place (`passes::CacheInPlace`) joins the kernel of an earlier
    /// one of the same geometry — axis, cached part, new part, element type — where that keeps
    /// the kernels acyclic: a decoder layer's key and value appends (both read from its
    /// projection, both read by its attention) are one launch, where they were two. Appends of
    /// different layers never join: a path through the earlier layer's attention leads from
    /// one to the other.
    pub(super) fn merge_sibling_appends(&mut self) {
        let geometry = |b: &Self, n: NodeId| {
            let Op::Append { axis } = b.graph.node(n).op else { return None };
            let inputs = b.graph.inputs_of(n);
            let shape = |i: NodeId| b.graph.node(i).ty.shape.clone();
            Some((axis, shape(inputs[0]), shape(inputs[1]), b.graph.node(n).ty.dtype))
        };
        let appends: Vec<NodeId> = self
            .order
            .iter()
            .copied()
            .filter(|&n| self.kernel_of.contains_key(&n) && geometry(self, n).is_some())
            .collect();
        for (i, &append) in appends.iter().enumerate() {
            for &earlier in appends[..i].iter().rev() {
                let (from, into) = (self.kernel_of[&append], self.kernel_of[&earlier]);
                if from != into
                    && geometry(self, append) == geometry(self, earlier)
                    && self.try_merge(from, into)
                {
                    break;
                }
            }
        }
    }
}

/// Whether the decoding kernel for attention of one query row (`codegen::attention::decode`)
/// runs `attention` and can take the key and value appends feeding it: half types, one query
/// row (at the top of any ranges, so always), the depth and the value width multiples of 8 of
/// at most 256. `FUSEC_ATTENTION_DECODE=0` (that kernel off) or `FUSEC_ATTENTION_APPENDS=0`
/// keeps the appends in a kernel of their own, for measuring.
pub fn decoding_takes_appends(graph: &Graph, attention: NodeId) -> bool {
    let node = graph.node(attention);
    let shape = &node.ty.shape;
    let inputs = graph.inputs_of(attention);
    let (Some(&depth), Some(&dv)) = (graph.node(inputs[0]).ty.shape.last(), shape.last()) else {
        return false;
    };
    let one_query = shape.len() >= 2 && shape[shape.len() - 2] == 1;
    let fits = depth % 8 == 0 && dv % 8 == 0 && depth.max(dv) <= 256;
    let off = knobs::off("FUSEC_ATTENTION_DECODE") || knobs::off("FUSEC_ATTENTION_APPENDS");
    matches!(node.ty.dtype, DType::F16 | DType::BF16) && one_query && fits && !off
}

/// The append behind attention operand `id` (K as `[.., depth, keys]`, V as `[.., keys,
/// width]`) through views, where the key axis (`key_axis` of `id`) is the append's axis, the
/// other of the two last axes its last, and the append adds one position: then a kernel can
/// read a key's (or value's) row from the append's buffer in runs along its last axis, and
/// the new position from the append's new part.
pub fn append_behind(graph: &Graph, mut id: NodeId, mut key_axis: usize) -> Option<NodeId> {
    let rank = graph.node(id).ty.rank();
    if rank < 2 || key_axis + 2 < rank || key_axis >= rank {
        return None;
    }
    let mut row_axis = if key_axis + 1 == rank { rank - 2 } else { rank - 1 };
    loop {
        let node = graph.node(id);
        if let Op::Append { axis } = node.op {
            let new = graph.inputs_of(id)[1];
            let last = node.ty.rank().checked_sub(1)?;
            let one = graph.node(new).ty.shape.get(axis) == Some(&1);
            return (axis == key_axis && row_axis == last && axis + 1 == last && one).then_some(id);
        }
        let input = *graph.inputs_of(id).first()?;
        (key_axis, row_axis) = match &node.op {
            Op::Transpose { perm } => (*perm.get(key_axis)?, *perm.get(row_axis)?),
            Op::Reshape { .. } | Op::Expand { .. } | Op::Identity | Op::Dropout => {
                // Views that keep the last two axes as they are.
                let (out, inner) = (&node.ty.shape, &graph.node(input).ty.shape);
                let (r, ri) = (out.len(), inner.len());
                let same_tail = r >= 2 && ri >= 2 && out[r - 2..] == inner[ri - 2..];
                if !same_tail || key_axis + 2 < r || row_axis + 2 < r {
                    return None;
                }
                (key_axis + ri - r, row_axis + ri - r)
            }
            _ => return None,
        };
        id = input;
    }
}

impl Builder<'_> {
    /// The kernel of a decoder layer's key and value appends joins its attention where the
    /// decoding kernel runs it ([`decoding_takes_appends`]): that kernel stores the new key
    /// and value into the cache and reads them from registers, one launch a layer fewer.
    pub(super) fn appends_into_decoding_attention(&mut self) {
        let attentions: Vec<NodeId> = self
            .order
            .iter()
            .copied()
            .filter(|&n| matches!(self.graph.node(n).op, Op::Attention { .. }))
            .collect();
        for attention in attentions {
            if !decoding_takes_appends(self.graph, attention) {
                continue;
            }
            let inputs = self.graph.inputs_of(attention);
            let rank = self.graph.node(inputs[1]).ty.rank();
            if rank < 2 {
                continue;
            }
            let k = append_behind(self.graph, inputs[1], rank - 1);
            let v = append_behind(self.graph, inputs[2], rank - 2);
            let (Some(k), Some(v)) = (k, v) else { continue };
            let (Some(&from), Some(&into)) = (self.kernel_of.get(&k), self.kernel_of.get(&attention)) else {
                continue;
            };
            // The appends' kernel holds these two appends and nothing else.
            let members: Vec<NodeId> =
                self.kernel_of.iter().filter(|(_, &kk)| kk == from).map(|(&n, _)| n).collect();
            let only_these = members.len() == 2 && members.contains(&k) && members.contains(&v);
            if only_these && k != v {
                self.try_merge_through(from, into, true);
            }
        }
    }
}
