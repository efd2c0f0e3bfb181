//! LayerNorm and RMSNorm from their decompositions, over the last axis. The variance comes in
//! two spellings (mean of squared deviations; E[x²] − E[x]²); the affine parts attach after.

use egg::rewrite;

use super::conditions::{is_float, is_scalar, row_param};
use super::Rule;

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("variance-of-deviations"; "(mean (* (- ?x (mean ?x)) (- ?x (mean ?x))))"          => "(variance ?x)"),
        rewrite!("variance-e-x2-minus-mean2"; "(- (mean (* ?x ?x)) (* (mean ?x) (mean ?x)))"       => "(variance ?x)"),
        rewrite!("layer-norm";
            "(* (- ?x (mean ?x)) (recip (sqrt (+ (variance ?x) ?eps))))" => "(layer_norm ?x none none ?eps)"
            if is_scalar("?eps") if is_float("?x")),
        rewrite!("layer-norm-rstd-first";
            "(* (recip (sqrt (+ (variance ?x) ?eps))) (- ?x (mean ?x)))" => "(layer_norm ?x none none ?eps)"
            if is_scalar("?eps") if is_float("?x")),
        rewrite!("layer-norm-scale"; "(* (layer_norm ?x none none ?eps) ?g)" => "(layer_norm ?x ?g none ?eps)" if row_param("?g", "?x")),
        rewrite!("layer-norm-bias";  "(+ (layer_norm ?x ?g none ?eps) ?b)"   => "(layer_norm ?x ?g ?b ?eps)"  if row_param("?g", "?x") if row_param("?b", "?x")),
        rewrite!("rms-norm";
            "(* ?x (recip (sqrt (+ (mean (* ?x ?x)) ?eps))))" => "(rms_norm ?x none ?eps)"
            if is_scalar("?eps") if is_float("?x")),
        rewrite!("rms-norm-rstd-first";
            "(* (recip (sqrt (+ (mean (* ?x ?x)) ?eps))) ?x)" => "(rms_norm ?x none ?eps)"
            if is_scalar("?eps") if is_float("?x")),
        rewrite!("rms-norm-scale"; "(* (rms_norm ?x none ?eps) ?g)" => "(rms_norm ?x ?g ?eps)" if row_param("?g", "?x")),
    ]
}
