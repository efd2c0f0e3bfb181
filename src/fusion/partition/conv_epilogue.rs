//! A convolution's kernel taking an activation that reads its result more than once.

use super::{Builder, KernelKind};
use crate::ir::NodeId;

impl Builder<'_> {
    /// A value a convolution's kernel computes that several pointwise ops read — `x·σ(x)`
    /// (SiLU), `x·HardSigmoid(x)` (HardSwish) — joins that kernel with all of them where they
    /// close on one op, the only one read outside: the kernel still keeps one output, and the
    /// activation is computed where the convolution's result is (the generated loop's own
    /// epilogue, or the one kernel after cuDNN) rather than read back by a kernel of its own.
    /// `id` is the first of those readers. Whether they joined.
    pub(super) fn closed_conv_epilogue(&mut self, id: NodeId) -> bool {
        /// Ops between the value and the one they close on, at most.
        const MOST: usize = 12;
        let shape = self.graph.node(id).ty.shape.clone();
        let same = |b: &Self, n: NodeId| b.free_pointwise(n) && b.graph.node(n).ty.shape == shape;
        let Some((value, k)) = self.graph.inputs_of(id).into_iter().find_map(|i| {
            let k = *self.kernel_of.get(&i)?;
            (self.kinds[k] == KernelKind::Conv
                && self.graph.node(i).ty.shape == shape
                && !self.outputs.contains(&i)
                && self.graph.users_of(i).len() > 1)
                .then_some((i, k))
        }) else {
            return false;
        };
        let mut members: Vec<NodeId> = self.graph.users_of(value);
        if !members.iter().all(|&u| same(self, u)) {
            return false;
        }
        // Until one member alone is read outside them: each step takes in the readers of the
        // earliest member read outside.
        loop {
            let escaping: Vec<NodeId> = members
                .iter()
                .copied()
                .filter(|&n| {
                    self.outputs.contains(&n) || self.graph.users_of(n).iter().any(|u| !members.contains(u))
                })
                .collect();
            if escaping.len() == 1 {
                break;
            }
            let Some(&first) = escaping.iter().min_by_key(|&&n| self.position[&n]) else { return false };
            if self.outputs.contains(&first) {
                return false;
            }
            for u in self.graph.users_of(first) {
                if !members.contains(&u) {
                    if !same(self, u) {
                        return false;
                    }
                    members.push(u);
                }
            }
            if members.len() > MOST {
                return false;
            }
        }
        members.sort_by_key(|n| self.position[n]);
        let mut joined = Vec::with_capacity(members.len());
        for &n in &members {
            if !self.try_absorb_downstream(n, k) {
                for j in joined {
                    self.kernel_of.remove(&j);
                }
                return false;
            }
            joined.push(n);
        }
        true
    }
}
