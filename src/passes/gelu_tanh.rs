//! An erf-GELU right after a GEMM computed in its tanh form, in half-type programs: cuBLASLt
//! applies GELU inside the GEMM's epilogue only in that form, and an erf-GELU otherwise costs an
//! epilogue kernel reading and rewriting the GEMM's (4×-wide, in a transformer's or ConvNeXt's
//! MLP) result. The two differ by at most 4.7e-4 absolute (near x = ±2.7), rel-L2 2e-4 over
//! unit-normal inputs: about the rounding of the f16 values themselves. f32 programs, and half
//! ones compiled with `--exact-gelu`, keep erf.

use crate::ir::{BinaryOp, Graph, IrError, NodeId, Op, UnaryOp};

/// Rewrites every erf-GELU whose input is a GEMM's result (through a bias `Add` of a constant
/// and reshapes) as a tanh-GELU; returns how many.
pub fn gelu_after_gemm_as_tanh(graph: &mut Graph) -> Result<usize, IrError> {
    let mut rewritten = 0;
    for id in graph.topo_order()? {
        if matches!(graph.node(id).op, Op::Unary(UnaryOp::Gelu))
            && follows_gemm(graph, graph.inputs_of(id)[0])
        {
            graph.node_mut(id).op = Op::Unary(UnaryOp::GeluTanh);
            rewritten += 1;
        }
    }
    Ok(rewritten)
}

/// Whether `id` is a GEMM's result, possibly behind a bias add of a constant (or a view of
/// one) and reshapes, each read only on the way to the GELU (else the GEMM's epilogue could
/// not take it, and nothing is gained).
fn follows_gemm(graph: &Graph, mut id: NodeId) -> bool {
    let mut biased = false;
    loop {
        let output = graph.outputs().iter().any(|(_, o)| *o == id);
        if graph.users_of(id).len() != 1 || output {
            return false;
        }
        match &graph.node(id).op {
            Op::MatMul | Op::Gemm { .. } => return true,
            Op::Reshape { .. } => id = graph.inputs_of(id)[0],
            Op::Binary(BinaryOp::Add) if !biased => {
                let inputs = graph.inputs_of(id);
                let constant = |i: NodeId| graph.constant(graph.behind_views(i)).is_some();
                let Some(&other) = inputs.iter().find(|&&i| constant(i)) else { return false };
                id = if inputs[0] == other { inputs[1] } else { inputs[0] };
                biased = true;
            }
            _ => return false,
        }
    }
}
