//! A matrix product over one element (`[.., M, 1] · [.., 1, N]`, an outer product: a rotary
//! embedding's inverse frequencies times the positions) is a broadcast `Mul`. As a GEMM it
//! was a library call of its own, the kernels before and after it apart from each other: the
//! Llama-style decoder's step began with five dependent launches for its rotary tables. As a
//! `Mul` it joins the pointwise kernels around it.

use crate::ir::{BinaryOp, Graph, IrError, Op};

use super::Pass;

/// Rewrites every `MatMul` of a constant whose operands are matrices (or batches of them) over
/// one element as a broadcast `Mul`.
pub struct OuterProducts;

impl Pass for OuterProducts {
    fn name(&self) -> &'static str {
        "outer-products"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewritten = 0;
        for id in graph.topo_order()? {
            if graph.node(id).op != Op::MatMul {
                continue;
            }
            let inputs = graph.inputs_of(id);
            let (a, b) = (&graph.node(inputs[0]).ty.shape, &graph.node(inputs[1]).ty.shape);
            // Rank 2 and more on both sides: a vector's MatMul drops an axis a Mul would keep.
            // One side a constant (the frequencies): attention's product with its values is
            // over the keys, one key at a sequence of one, and must stay a MatMul for the
            // attention rules.
            let constant = inputs.iter().any(|&i| graph.constant(graph.behind_views(i)).is_some());
            let outer =
                constant && a.len() >= 2 && b.len() >= 2 && a[a.len() - 1] == 1 && b[b.len() - 2] == 1;
            if outer {
                graph.node_mut(id).op = Op::Binary(BinaryOp::Mul);
                rewritten += 1;
            }
        }
        Ok(rewritten)
    }
}
