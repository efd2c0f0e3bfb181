//! Two kernels of the partition made one, where that keeps the kernels acyclic.

use std::collections::HashSet;

use super::{Builder, Role};
use crate::ir::NodeId;

impl Builder<'_> {
    /// Moves every node of kernel `from` into kernel `into` unless a path leaves the two and
    /// comes back (the merged kernel would wait on itself) or a reader of other elements
    /// would meet its input's producer.
    pub(super) fn try_merge(&mut self, from: usize, into: usize) -> bool {
        self.try_merge_through(from, into, false)
    }

    /// [`Builder::try_merge`]; with `views_inside`, a path from one kernel to the other
    /// through views alone stays inside the merged kernel (one that reads through views, as
    /// attention reads its keys through a transpose of the cache it appends to).
    pub(super) fn try_merge_through(&mut self, from: usize, into: usize, views_inside: bool) -> bool {
        let members: Vec<NodeId> =
            self.kernel_of.iter().filter(|(_, &k)| k == from || k == into).map(|(&n, _)| n).collect();
        let inside = |b: &Self, n: NodeId| matches!(b.kernel_of.get(&n), Some(&k) if k == from || k == into);
        let free_view =
            |b: &Self, n: NodeId| views_inside && b.roles[&n] == Role::View && !b.kernel_of.contains_key(&n);
        // (node, whether the path to it has left the two kernels through a node that is not a
        // free view).
        let mut stack: Vec<(NodeId, bool)> = members
            .iter()
            .flat_map(|&n| self.graph.users_of(n))
            .filter(|&u| !inside(self, u))
            .map(|u| (u, !free_view(self, u)))
            .collect();
        let mut seen = HashSet::new();
        while let Some((n, left)) = stack.pop() {
            if !seen.insert((n, left)) {
                continue;
            }
            if inside(self, n) {
                if left {
                    return false;
                }
                continue;
            }
            let left = left || !free_view(self, n);
            stack.extend(self.graph.users_of(n).into_iter().map(|u| (u, left)));
        }
        let moved: Vec<NodeId> = members.into_iter().filter(|n| self.kernel_of[n] == from).collect();
        if moved.iter().any(|&n| self.reads_across(n, into)) {
            return false;
        }
        for n in moved {
            self.kernel_of.insert(n, into);
        }
        true
    }
}
