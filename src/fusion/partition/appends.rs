//! Appends to caches updated in place that share one shape (a decoder layer's keys and
//! values) in one kernel.

use super::Builder;
use crate::ir::{NodeId, Op};

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
