//! Dead-code elimination: drops every node no graph output depends on.

use super::Pass;
use crate::ir::{Graph, IrError};

/// Removes nodes that no graph output depends on.
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        Ok(graph.remove_unused())
    }
}
