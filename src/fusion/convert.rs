//! IR → e-graph: every IR node becomes one e-node, shared values stay shared.

use std::collections::HashMap;

use egg::Id;

use super::analysis::{FusionAnalysis, FusionGraph};
use super::lang::{FusionLang, Perm};
use super::FusionError;
use crate::ir::{BinaryOp, Graph, NodeId, Op, ReduceOp, Tensor, UnaryOp};

/// The e-graph of a whole IR graph, with the class of every IR node.
pub struct Lowered {
    pub egraph: FusionGraph,
    pub class_of: HashMap<NodeId, Id>,
}

fn scalar_class(egraph: &mut FusionGraph, value: f32) -> Id {
    let c = egraph.analysis.intern_constant(std::sync::Arc::new(Tensor::scalar_f32(value)));
    egraph.add(FusionLang::Const(c))
}

pub fn lower(graph: &Graph) -> Result<Lowered, FusionError> {
    let mut egraph = FusionGraph::new(FusionAnalysis::default());
    let mut class_of: HashMap<NodeId, Id> = HashMap::new();
    for id in graph.topo_order()? {
        let node = graph.node(id);
        let c: Vec<Id> = graph.inputs_of(id).iter().map(|i| class_of[i]).collect();
        let rank = |i: usize| graph.node(graph.inputs_of(id)[i]).ty.rank();
        let last = |axis: usize| axis + 1 == rank(0);
        let absent = |egraph: &mut FusionGraph| egraph.add(FusionLang::Absent);
        let enode = match &node.op {
            Op::Input { name } => FusionLang::Input(egraph.analysis.add_input(name, node.ty.clone())),
            // The model's weights are one class each; constants folded at import are shared
            // by value (every layer's copy of a mask is one class).
            Op::Constant(t) if node.origin.op_type == "Initializer" => {
                FusionLang::Const(egraph.analysis.intern_tensor(t.clone()))
            }
            Op::Constant(t) => FusionLang::Const(egraph.analysis.intern_constant(t.clone())),
            Op::Binary(BinaryOp::Add) => FusionLang::Add([c[0], c[1]]),
            Op::Binary(BinaryOp::Sub) => FusionLang::Sub([c[0], c[1]]),
            Op::Binary(BinaryOp::Mul) => FusionLang::Mul([c[0], c[1]]),
            Op::Binary(BinaryOp::Div) => FusionLang::Div([c[0], c[1]]),
            Op::Binary(BinaryOp::Pow) => FusionLang::Pow([c[0], c[1]]),
            Op::Unary(UnaryOp::Neg) => FusionLang::Neg([c[0]]),
            Op::Unary(UnaryOp::Sqrt) => FusionLang::Sqrt([c[0]]),
            Op::Unary(UnaryOp::Reciprocal) => FusionLang::Recip([c[0]]),
            Op::Unary(UnaryOp::Exp) => FusionLang::Exp([c[0]]),
            Op::Unary(UnaryOp::Erf) => FusionLang::Erf([c[0]]),
            Op::Unary(UnaryOp::Tanh) => FusionLang::Tanh([c[0]]),
            Op::Unary(UnaryOp::IsNaN) => FusionLang::IsNaN([c[0]]),
            Op::Unary(UnaryOp::NanToZero) => FusionLang::NanToZero([c[0]]),
            Op::Unary(UnaryOp::Gelu) => FusionLang::Gelu([c[0]]),
            Op::Unary(UnaryOp::GeluTanh) => FusionLang::GeluTanh([c[0]]),
            Op::Reduce { op, axes, keep_dims: true } if axes.len() == 1 && last(axes[0]) => match op {
                ReduceOp::Mean => FusionLang::Mean([c[0]]),
                ReduceOp::Sum => FusionLang::Sum([c[0]]),
                ReduceOp::Max => FusionLang::Max([c[0]]),
            },
            Op::Softmax { axis } if last(*axis) => FusionLang::Softmax([c[0]]),
            Op::MatMul => FusionLang::MatMul([c[0], c[1]]),
            Op::Where => FusionLang::Where([c[0], c[1], c[2]]),
            Op::Dropout => FusionLang::Dropout([c[0]]),
            Op::Identity => FusionLang::Identity([c[0]]),
            Op::Transpose { perm } => {
                let p = egraph.add(FusionLang::Perm(Perm(perm.clone())));
                FusionLang::Transpose([c[0], p])
            }
            Op::LayerNorm { axis, epsilon } if last(*axis) => {
                let eps = scalar_class(&mut egraph, *epsilon);
                let g = c.get(1).copied().unwrap_or_else(|| absent(&mut egraph));
                let b = c.get(2).copied().unwrap_or_else(|| absent(&mut egraph));
                FusionLang::LayerNorm([c[0], g, b, eps])
            }
            Op::RmsNorm { axis, epsilon, deviation: false } if last(*axis) => {
                let eps = scalar_class(&mut egraph, *epsilon);
                let g = c.get(1).copied().unwrap_or_else(|| absent(&mut egraph));
                FusionLang::RmsNorm([c[0], g, eps])
            }
            Op::Attention { scale, nan_to_zero } => {
                let s = scalar_class(&mut egraph, *scale);
                let m = c.get(3).copied().unwrap_or_else(|| absent(&mut egraph));
                let children = [c[0], c[1], c[2], m, s];
                if *nan_to_zero {
                    FusionLang::AttentionNanToZero(children)
                } else {
                    FusionLang::Attention(children)
                }
            }
            op => FusionLang::Other(egraph.analysis.intern_op(op.clone()), c),
        };
        class_of.insert(id, egraph.add(enode));
    }
    egraph.rebuild();
    Ok(Lowered { egraph, class_of })
}
