//! Gives every attention node its own copy of the pointwise ops that compute its mask from
//! the model's inputs and constants, so that each attention kernel computes its mask at each
//! score instead of reading one materialised `[b, 1, q, k]` tensor. The exporters build a
//! padding mask once (`where(mask[b, None, None, :] & causal, 0, min)`) and every layer reads
//! it; after this pass the layers' kernels each evaluate those few ops where they need them.

use std::collections::{HashMap, HashSet};

use crate::ir::{Graph, IrError, NodeId, Op};

/// Masks computed by more nodes than this stay materialised.
const MOST_NODES: usize = 24;

/// The nodes between attention node `attention`'s mask and the graph inputs and constants it
/// is computed from — pointwise ops and views only, at least one pointwise op — in
/// topological order; `None` when the mask reads anything else, is an input or constant
/// itself, or takes more than a few ops.
pub fn mask_prologue(graph: &Graph, attention: NodeId) -> Option<Vec<NodeId>> {
    if !matches!(graph.node(attention).op, Op::Attention { .. }) {
        return None;
    }
    let mask = *graph.inputs_of(attention).get(3)?;
    let (mut order, mut seen) = (Vec::new(), HashSet::new());
    gather_prologue(graph, mask, &mut order, &mut seen)?;
    order.iter().any(|&n| graph.node(n).op.is_pointwise()).then_some(order)
}

/// Adds `n` and the nodes it is computed from (up to graph inputs and constants) to `order`
/// after their inputs (depth first, so in topological order); `None` at anything but a
/// pointwise op or a view, or past [`MOST_NODES`].
fn gather_prologue(
    graph: &Graph,
    n: NodeId,
    order: &mut Vec<NodeId>,
    seen: &mut HashSet<NodeId>,
) -> Option<()> {
    let op = &graph.node(n).op;
    if matches!(op, Op::Input { .. } | Op::Constant(_)) || !seen.insert(n) {
        return Some(());
    }
    if !(op.is_pointwise() || op.is_view()) || seen.len() > MOST_NODES {
        return None;
    }
    for input in graph.inputs_of(n) {
        gather_prologue(graph, input, order, seen)?;
    }
    order.push(n);
    Some(())
}

/// Whether nothing but `attention` and the prologue itself reads `prologue` (the nodes
/// [`mask_prologue`] gives), and no node of it is in `outputs`.
pub fn owns_prologue(
    graph: &Graph,
    attention: NodeId,
    prologue: &[NodeId],
    outputs: &HashSet<NodeId>,
) -> bool {
    let inside: HashSet<NodeId> = prologue.iter().copied().chain([attention]).collect();
    prologue.iter().all(|&n| !outputs.contains(&n) && graph.users_of(n).iter().all(|u| inside.contains(u)))
}

/// Copies each attention node's mask prologue ([`mask_prologue`]) where anything else reads
/// it (another attention node, usually), so that every attention node reads a prologue of
/// its own; the copies cover the same ONNX nodes (`covers`). Returns how many prologues were
/// copied; the originals left unread are removed.
pub fn own_attention_masks(
    graph: &mut Graph,
    covers: &mut HashMap<NodeId, Vec<String>>,
) -> Result<usize, IrError> {
    let outputs: HashSet<NodeId> = graph.outputs().iter().map(|(_, id)| *id).collect();
    let mut copied = 0;
    for attention in graph.topo_order()? {
        let Some(prologue) = mask_prologue(graph, attention) else { continue };
        if owns_prologue(graph, attention, &prologue, &outputs) {
            continue;
        }
        let mut copy: HashMap<NodeId, NodeId> = HashMap::new();
        for &n in &prologue {
            let inputs: Vec<NodeId> = graph.inputs_of(n).iter().map(|i| *copy.get(i).unwrap_or(i)).collect();
            let node = graph.node(n);
            let (op, name, origin) = (node.op.clone(), node.name.clone(), node.origin.clone());
            let new = graph.add_op(op, &inputs, &name, origin)?;
            if let Some(names) = covers.get(&n).cloned() {
                covers.insert(new, names);
            }
            copy.insert(n, new);
        }
        let mask = graph.inputs_of(attention)[3];
        graph.set_input(attention, 3, copy[&mask]);
        copied += 1;
    }
    if copied > 0 {
        graph.remove_unused();
    }
    Ok(copied)
}
