//! Runs of neighbouring elementwise kernels (pointwise, gathers, copies) that may be launched
//! as one (`codegen::siblings`): none reads what an earlier one of the run computes. The
//! planner keeps every value a run reads alive to the run's end, so that no kernel of it
//! writes over what another reads while they run at once.

use std::collections::HashSet;

use crate::fusion::{Kernel, KernelKind};
use crate::ir::{Graph, NodeId};

/// The most kernels one launch runs.
pub const MOST: usize = 4;

/// `(first, last)` of each run of two to [`MOST`] neighbouring elementwise kernels of `kernels`
/// none of which reads (through views) a value an earlier one of the run computes; none with
/// `FUSEC_MERGE_SIBLINGS=0` (at compile time).
pub fn sibling_runs(graph: &Graph, kernels: &[Kernel]) -> Vec<(usize, usize)> {
    if crate::knobs::off("FUSEC_MERGE_SIBLINGS") {
        return Vec::new();
    }
    // Kernels of one thread an element (`codegen::elementwise`): pointwise ops, gathers
    // (embeddings), layout copies.
    let pointwise =
        |k: usize| matches!(kernels[k].kind, KernelKind::Pointwise | KernelKind::Gather | KernelKind::Copy);
    let mut runs = Vec::new();
    let mut first = 0;
    while first < kernels.len() {
        if !pointwise(first) {
            first += 1;
            continue;
        }
        let mut produced: HashSet<NodeId> = kernels[first].nodes.iter().copied().collect();
        let mut last = first;
        while last + 1 < kernels.len() && last + 1 - first < MOST && pointwise(last + 1) {
            let next = &kernels[last + 1];
            if reads_any(graph, next, &produced) {
                break;
            }
            produced.extend(next.nodes.iter().copied());
            last += 1;
        }
        if last > first {
            runs.push((first, last));
        }
        first = last + 1;
    }
    runs
}

/// Whether `kernel` reads, directly or through views it does not compute, a node of `produced`.
fn reads_any(graph: &Graph, kernel: &Kernel, produced: &HashSet<NodeId>) -> bool {
    kernel.nodes.iter().any(|&node| {
        graph.inputs_of(node).into_iter().any(|mut source| loop {
            if produced.contains(&source) {
                break true;
            }
            if kernel.nodes.contains(&source) || !graph.node(source).op.is_view() {
                break false;
            }
            source = graph.inputs_of(source)[0];
        })
    })
}
