//! Small broadcast vectors stored: a uniform folded value is imported as a broadcast of one
//! element (`ir::UNIFORM_ELEMENTS`), which saves memory for large ones (an attention mask of
//! ones) but turns a LayerNorm's weight of ones, a zero bias or a uniform layer scale into a
//! view that a kernel reading it as a buffer (a norm's weights, a GEMM's or a convolution's
//! bias) had copied out on every run. After fusion, a broadcast of a constant to a vector of
//! at most `MAX_ELEMENTS` is made a constant of its own: a few kilobytes of weights, once.

use std::sync::Arc;

use crate::ir::{Graph, IrError, Op};

/// The longest vector stored.
pub const MAX_ELEMENTS: usize = 65_536;

/// Replaces every broadcast of a constant to a vector of at most `MAX_ELEMENTS` elements by
/// that vector stored; returns how many.
pub fn store_small_vectors(graph: &mut Graph) -> Result<usize, IrError> {
    let mut stored = 0;
    for id in graph.topo_order()? {
        let node = graph.node(id);
        let (Op::Expand { .. }, [length]) = (&node.op, node.ty.shape.as_slice()) else { continue };
        if *length > MAX_ELEMENTS {
            continue;
        }
        let source = graph.inputs_of(id)[0];
        let Some(value) = graph.constant(source) else { continue };
        let expanded = crate::ir::ops::evaluate(&node.op, &[value.as_ref()])
            .map_err(|message| IrError::Op { node: node.name.clone(), op: "Expand".into(), message })?;
        let (name, origin) = (node.name.clone(), node.origin.clone());
        let constant = graph.add_constant(&name, Arc::new(expanded), origin);
        graph.replace_uses(id, constant);
        stored += 1;
    }
    if stored > 0 {
        graph.remove_unused();
    }
    Ok(stored)
}
