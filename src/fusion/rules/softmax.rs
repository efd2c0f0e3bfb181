//! Softmax from exp(x − max)/sum(exp(x − max)) (or unshifted), and the NaN guard some
//! exporters put after it: where(isnan(softmax(x)), 0, softmax(x)), which runs as
//! nan0(softmax(x)) where it is not part of an attention kernel.

use egg::rewrite;

use super::conditions::all_equal;
use super::Rule;

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("softmax-shifted";   "(* (exp (- ?x (max ?x))) (recip (sum (exp (- ?x (max ?x))))))" => "(softmax ?x)"),
        rewrite!("softmax-unshifted"; "(* (exp ?x) (recip (sum (exp ?x))))"                           => "(softmax ?x)"),
        rewrite!("softmax-nan-guard"; "(where (isnan (softmax ?x)) ?zero (softmax ?x))"               => "(softmax_nan0 ?x)" if all_equal("?zero", 0.0)),
        // The guard as one pointwise op after the softmax: what runs where attention is
        // cheaper as GEMMs (the row kernel takes it as its epilogue).
        rewrite!("softmax-nan-guard-pointwise"; "(softmax_nan0 ?x)"                                 => "(nan0 (softmax ?x))"),
    ]
}
