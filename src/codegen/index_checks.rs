//! The bundle's table of index checks: every gather of a generated kernel reads its index through
//! `fusec::checked_index`, which reports an index outside its axis as the gathering node's code
//! (in page-locked memory the session reads after each run) and reads 0 instead. The table
//! turns a reported code back into the node, its indices and the axis they must lie in, so that
//! the session's error names them.

use std::collections::BTreeMap;

use crate::ir::{NodeId, Op};
use crate::plan::Plan;

/// Codes are below this: a report holds the code in the bits above the 40 of the index read.
pub const INDEX_FAULT_CODES: u32 = 1 << 24;

/// The code node `id`'s gathers report (never 0: the word the session reads is 0 until one
/// does; a node past the codes reports the last, which the table does not hold).
pub fn index_fault_code(id: NodeId) -> u32 {
    u32::try_from(id.index())
        .map_or(INDEX_FAULT_CODES - 1, |i| i.saturating_add(1).min(INDEX_FAULT_CODES - 1))
}

/// The plan's gathers: each node with its data and indices.
fn gathers(plan: &Plan) -> impl Iterator<Item = (NodeId, NodeId, NodeId)> + '_ {
    let graph = &plan.graph;
    graph.node_ids().filter_map(move |id| {
        let gathers =
            matches!(graph.node(id).op, Op::Gather { .. } | Op::GatherElements { .. } | Op::GatherNd { .. });
        let inputs = graph.inputs_of(id);
        match (gathers, inputs.first(), inputs.get(1)) {
            (true, Some(&data), Some(&indices)) => Some((id, data, indices)),
            _ => None,
        }
    })
}

/// The size of a gather's data along `axis`: `None` where it has no such axis, `Some(None)`
/// where the size follows the ranges (a program for ranges), else the one size.
fn axis_size(plan: &Plan, data: NodeId, axis: usize) -> Option<Option<usize>> {
    plan.dims(data).get(axis).map(|d| d.value())
}

/// What each code of the plan's gathers stands for: the node, the tensor of indices and the
/// axes its values must lie in.
pub fn index_checks(plan: &Plan) -> BTreeMap<u32, String> {
    let graph = &plan.graph;
    let mut table = BTreeMap::new();
    for (id, data, indices) in gathers(plan) {
        let node = graph.node(id);
        let data_node = graph.node(data);
        let shape = &data_node.ty.shape;
        let within = match &node.op {
            Op::Gather { axis } | Op::GatherElements { axis } => match axis_size(plan, data, *axis) {
                Some(Some(n)) => {
                    format!("axis {axis} of '{}' ({n} entries: -{n} to {})", data_node.name, n as i64 - 1)
                }
                Some(None) => format!(
                    "axis {axis} of '{}' (its size at this run's point of the ranges)",
                    data_node.name
                ),
                None => continue,
            },
            Op::GatherNd { batch_dims: 0 } => {
                format!("the axis of '{}' {shape:?} it indexes", data_node.name)
            }
            Op::GatherNd { batch_dims } => {
                format!(
                    "the axis of '{}' {shape:?} it indexes (past its {batch_dims} batch axes)",
                    data_node.name
                )
            }
            _ => continue,
        };
        let onnx = if node.origin.node.is_empty() { node.name.as_str() } else { node.origin.node.as_str() };
        let message = format!(
            "{} node '{onnx}': a value of '{}' lies outside {within}",
            node.op.kind(),
            graph.node(indices).name
        );
        let code = index_fault_code(id);
        if code < INDEX_FAULT_CODES - 1 {
            table.insert(code, message);
        }
    }
    table
}

/// For each model input whose values index a table directly (a `Gather` or `GatherElements` of
/// it, through casts, reshapes and other ops that keep its values), the smallest such table's
/// axis: `fusec bench` draws that input's random values below it, so that its own inputs never
/// trip the check.
pub fn index_limits(plan: &Plan) -> BTreeMap<String, usize> {
    let graph = &plan.graph;
    let mut limits: BTreeMap<String, usize> = BTreeMap::new();
    for (id, data, indices) in gathers(plan) {
        let (Op::Gather { axis } | Op::GatherElements { axis }) = graph.node(id).op else { continue };
        let Some(Some(size)) = axis_size(plan, data, axis) else { continue };
        // Back through ops that keep the values, to a model input.
        let mut at = indices;
        loop {
            let node = graph.node(at);
            match &node.op {
                Op::Input { name } => {
                    let limit = limits.entry(name.clone()).or_insert(size);
                    *limit = (*limit).min(size);
                    break;
                }
                Op::Cast { .. }
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Expand { .. }
                | Op::Slice { .. }
                | Op::Identity => match graph.inputs_of(at).first() {
                    Some(&input) => at = input,
                    None => break,
                },
                _ => break,
            }
        }
    }
    limits
}
