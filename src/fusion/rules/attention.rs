//! Attention: matmul(softmax(scale · q·kt [+ mask]), v), with the scale already moved out of
//! q and kt by the canonical rules, an optional additive mask (a causal `where` on constants
//! becomes one), and the optional NaN guard.

use std::sync::Arc;

use egg::{rewrite, Applier, Id, PatternAst, Subst, Symbol, Var};

use super::conditions::{is_scalar, mask_fits_scores};
use super::{pattern_var, union_with_match, Rule};
use crate::fusion::analysis::{FusionAnalysis, FusionGraph};
use crate::fusion::lang::FusionLang;
use crate::ir::{ops::elementwise, Tensor};

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("attention-masked";
            "(matmul (softmax (+ (* (matmul ?q ?k) ?s) ?m)) ?v)"      => "(attention ?q ?k ?v ?m ?s)"
            if is_scalar("?s") if mask_fits_scores("?m", "?q", "?k")),
        rewrite!("attention-masked-nan0";
            "(matmul (softmax_nan0 (+ (* (matmul ?q ?k) ?s) ?m)) ?v)" => "(attention_nan0 ?q ?k ?v ?m ?s)"
            if is_scalar("?s") if mask_fits_scores("?m", "?q", "?k")),
        rewrite!("attention";
            "(matmul (softmax (* (matmul ?q ?k) ?s)) ?v)"             => "(attention ?q ?k ?v none ?s)"
            if is_scalar("?s")),
        rewrite!("attention-nan0";
            "(matmul (softmax_nan0 (* (matmul ?q ?k) ?s)) ?v)"        => "(attention_nan0 ?q ?k ?v none ?s)"
            if is_scalar("?s")),
        rewrite!("unscaled-scores"; "(softmax (+ (matmul ?q ?k) ?m))" => { UnitScale::new() }
            if mask_fits_scores("?m", "?q", "?k")),
        rewrite!("causal-where-to-mask"; "(softmax (where ?keep ?scores ?fill))" => { WhereAsMask::new() }),
    ]
}

fn constant_class(egraph: &mut FusionGraph, value: Tensor) -> Id {
    let c = egraph.analysis.intern_constant(Arc::new(value));
    egraph.add(FusionLang::Const(c))
}

/// softmax(q·kt + m) = softmax(1 · (q·kt) + m): gives unscaled scores the scaled shape.
struct UnitScale {
    q: Var,
    k: Var,
    m: Var,
}

impl UnitScale {
    fn new() -> Self {
        UnitScale { q: pattern_var("?q"), k: pattern_var("?k"), m: pattern_var("?m") }
    }
}

impl Applier<FusionLang, FusionAnalysis> for UnitScale {
    fn apply_one(
        &self,
        egraph: &mut FusionGraph,
        matched: Id,
        subst: &Subst,
        _: Option<&PatternAst<FusionLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let Some(dtype) = egraph[subst[self.q]].data.ty.as_ref().map(|t| t.dtype) else { return vec![] };
        let one = constant_class(egraph, Tensor::scalar_f32(1.0).cast(dtype));
        let scores = egraph.add(FusionLang::MatMul([subst[self.q], subst[self.k]]));
        let scaled = egraph.add(FusionLang::Mul([scores, one]));
        let masked = egraph.add(FusionLang::Add([scaled, subst[self.m]]));
        let result = egraph.add(FusionLang::Softmax([masked]));
        union_with_match(egraph, matched, result)
    }
}

/// softmax(where(keep, s, fill)) = softmax(s + where(keep, 0, fill)) for constant `keep` and a
/// constant `fill` of -inf or the type's lowest value: both give masked scores weight 0.
struct WhereAsMask {
    keep: Var,
    scores: Var,
    fill: Var,
}

impl WhereAsMask {
    fn new() -> Self {
        WhereAsMask { keep: pattern_var("?keep"), scores: pattern_var("?scores"), fill: pattern_var("?fill") }
    }
}

impl Applier<FusionLang, FusionAnalysis> for WhereAsMask {
    fn apply_one(
        &self,
        egraph: &mut FusionGraph,
        matched: Id,
        subst: &Subst,
        _: Option<&PatternAst<FusionLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let (Some(keep), Some(fill)) =
            (egraph[subst[self.keep]].data.constant.clone(), egraph[subst[self.fill]].data.constant.clone())
        else {
            return vec![];
        };
        let very_negative = fill.to_f64_vec().iter().all(|&v| v == f64::NEG_INFINITY || v <= f32::MIN as f64);
        if !very_negative {
            return vec![];
        }
        let zero = Tensor::full(&fill.tensor_type(), 0.0);
        let Ok(mask) = elementwise::eval_where(&keep, &zero, &fill) else { return vec![] };
        let mask = constant_class(egraph, mask);
        let masked = egraph.add(FusionLang::Add([subst[self.scores], mask]));
        let result = egraph.add(FusionLang::Softmax([masked]));
        union_with_match(egraph, matched, result)
    }
}
