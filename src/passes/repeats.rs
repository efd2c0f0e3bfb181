//! A concatenation of one value with itself (a rotary embedding's `cat((freqs, freqs), -1)`)
//! is a `Tile`, which the kernel reading it computes as it reads (each element from the
//! value's memory at its coordinates modulo the value's sizes) instead of a concatenation
//! kernel writing the copy out: one launch fewer at the start of each of the Llama-style
//! decoder's steps. Off unless `FUSEC_REPEATS_AS_TILES=1` (at compile time): on an H200 the
//! kernels it gives (a Tile read inside a pointwise kernel) were correct but the step no faster.

use crate::ir::{Graph, IrError, Op};

use super::Pass;

/// Rewrites every `Concat` whose inputs are all one value as a `Tile` of it.
pub struct RepeatsAsTiles;

impl Pass for RepeatsAsTiles {
    fn name(&self) -> &'static str {
        "repeats-as-tiles"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewritten = 0;
        for id in graph.topo_order()? {
            let Op::Concat { axis } = graph.node(id).op else { continue };
            let inputs = graph.inputs_of(id);
            if inputs.len() < 2 || inputs.iter().any(|&i| i != inputs[0]) {
                continue;
            }
            let mut repeats = vec![1; graph.node(id).ty.rank()];
            repeats[axis] = inputs.len();
            let node = graph.node(id);
            let (name, origin) = (node.name.clone(), node.origin.clone());
            let tile = graph.add_op(Op::Tile { repeats }, &[inputs[0]], &name, origin)?;
            graph.replace_uses(id, tile);
            rewritten += 1;
        }
        if rewritten > 0 {
            graph.remove_unused();
        }
        Ok(rewritten)
    }
}
