//! Softmax from exp(x − max)/sum(exp(x − max)) (or unshifted), and the NaN guard some
//! exporters put after it: where(isnan(softmax(x)), 0, softmax(x)).

use egg::rewrite;

use super::conditions::all_equal;
use super::Rule;

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("softmax-shifted";   "(* (exp (- ?x (max ?x))) (recip (sum (exp (- ?x (max ?x))))))" => "(softmax ?x)"),
        rewrite!("softmax-unshifted"; "(* (exp ?x) (recip (sum (exp ?x))))"                           => "(softmax ?x)"),
        rewrite!("softmax-nan-guard"; "(where (isnan (softmax ?x)) ?zero (softmax ?x))"               => "(softmax_nan0 ?x)" if all_equal("?zero", 0.0)),
    ]
}
