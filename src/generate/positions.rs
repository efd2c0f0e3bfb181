//! How many positions a decoder can take. Where its `position_ids` index a table (GPT-2's
//! learned position embeddings: a `Gather` of an initializer at them), the table's rows bound
//! the cache: a step at a position past them would read outside the table, so a generation
//! that would reach one is refused before anything is compiled, naming the table.

use std::collections::HashMap;
use std::path::Path;

use tract_onnx::pb;

use super::{cache, GenerateError};

/// Ops a position's index passes through unchanged on its way to the table.
const PASS_THROUGH: [&str; 6] = ["Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten"];

/// The node (its name, or its output's where it has none) that reads a table at `model`'s
/// `position_ids`, and the table's rows; `None` where no such table is read (positions computed,
/// as rotary embeddings are).
pub fn table(model: &Path) -> Result<Option<(String, usize)>, GenerateError> {
    let proto = crate::import::load_proto(model).map_err(|e| GenerateError::Compile {
        // The import error names the file.
        what: "reading the model".into(),
        source: Box::new(e.into()),
    })?;
    let Some(graph) = proto.graph.as_ref() else { return Ok(None) };
    let producers: HashMap<&str, &pb::NodeProto> =
        graph.node.iter().flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n))).collect();
    // The rows of a table stored as an initializer or a `Constant` node's value.
    let rows = |name: &str| -> Option<usize> {
        let dims = match graph.initializer.iter().find(|t| t.name == name) {
            Some(t) => t.dims.clone(),
            None => {
                let node = producers.get(name).filter(|n| n.op_type == "Constant")?;
                node.attribute.iter().find(|a| a.name == "value")?.t.as_ref()?.dims.clone()
            }
        };
        dims.first().and_then(|&d| usize::try_from(d).ok())
    };
    for node in graph.node.iter().filter(|n| n.op_type == "Gather" && n.input.len() == 2) {
        let axis = node.attribute.iter().find(|a| a.name == "axis").map_or(0, |a| a.i);
        if axis == 0 && from_positions(&producers, &node.input[1]) {
            if let Some(rows) = rows(&node.input[0]) {
                let name = if node.name.is_empty() {
                    node.output.first().cloned().unwrap_or_default()
                } else {
                    node.name.clone()
                };
                return Ok(Some((name, rows)));
            }
        }
    }
    Ok(None)
}

/// An error where a step with a cache of `capacity` positions may take a position past
/// `model`'s table: a full cache's step sits at position `capacity`.
pub fn check(model: &Path, capacity: usize) -> Result<(), GenerateError> {
    match table(model)? {
        Some((node, rows)) if capacity >= rows => Err(GenerateError::Input(format!(
            "{}: a cache of {capacity} positions (the longest prompt and the new tokens) lets a step take \
             position {capacity}, past the {rows} rows of the position table that '{node}' reads: the \
             cache may hold at most {} (a shorter prompt or fewer new tokens)",
            model.display(),
            rows - 1,
        ))),
        _ => Ok(()),
    }
}

/// Whether `name` is the `position_ids` input, or it passed through [`PASS_THROUGH`] ops alone.
fn from_positions<'a>(producers: &HashMap<&'a str, &'a pb::NodeProto>, mut name: &'a str) -> bool {
    loop {
        if name == cache::POSITIONS {
            return true;
        }
        match producers.get(name) {
            Some(n) if PASS_THROUGH.contains(&n.op_type.as_str()) && !n.input.is_empty() => {
                name = &n.input[0]
            }
            _ => return false,
        }
    }
}
