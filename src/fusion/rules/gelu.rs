//! GELU: the exact erf form x·½·(1 + erf(x/√2)) and the tanh approximation (GPT-2's
//! `gelu_new`), each only ever to itself: an approximation never becomes the exact function.
//! After canonicalisation the ½ is outermost and 1/√2 a multiplier.

use egg::rewrite;

use super::conditions::scalar_is;
use super::Rule;

const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// √(2/π), the tanh approximation's inner scale.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("gelu-erf";
            "(* (* ?x (+ (erf (* ?x ?k)) ?one)) ?half)" => "(gelu ?x)"
            if scalar_is("?k", FRAC_1_SQRT_2) if scalar_is("?one", 1.0) if scalar_is("?half", 0.5)),
        rewrite!("gelu-erf-sum-first";
            "(* (* (+ (erf (* ?x ?k)) ?one) ?x) ?half)" => "(gelu ?x)"
            if scalar_is("?k", FRAC_1_SQRT_2) if scalar_is("?one", 1.0) if scalar_is("?half", 0.5)),
        rewrite!("gelu-tanh";
            "(* (* ?x (+ (tanh (* (+ ?x (* (pow ?x ?three) ?c)) ?k)) ?one)) ?half)" => "(gelu_tanh ?x)"
            if scalar_is("?three", 3.0) if scalar_is("?c", 0.044715) if scalar_is("?k", SQRT_2_OVER_PI)
            if scalar_is("?one", 1.0) if scalar_is("?half", 0.5)),
        rewrite!("gelu-tanh-sum-first";
            "(* (* (+ (tanh (* (+ ?x (* (pow ?x ?three) ?c)) ?k)) ?one) ?x) ?half)" => "(gelu_tanh ?x)"
            if scalar_is("?three", 3.0) if scalar_is("?c", 0.044715) if scalar_is("?k", SQRT_2_OVER_PI)
            if scalar_is("?one", 1.0) if scalar_is("?half", 0.5)),
        rewrite!("gelu-tanh-cube-first";
            "(* (* ?x (+ (tanh (* (+ (* (pow ?x ?three) ?c) ?x) ?k)) ?one)) ?half)" => "(gelu_tanh ?x)"
            if scalar_is("?three", 3.0) if scalar_is("?c", 0.044715) if scalar_is("?k", SQRT_2_OVER_PI)
            if scalar_is("?one", 1.0) if scalar_is("?half", 0.5)),
    ]
}
