//! Canonical forms that let one pattern match many spellings: division by x becomes
//! multiplication by recip(x), x² a self-product, constants move to the right of + and ·,
//! scalar scales move outwards (through products and matmuls) and merge.

use egg::rewrite;

use super::conditions::{is_const, is_scalar, not_const, scalar_is};
use super::Rule;

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("div-to-mul-recip";          "(/ ?a ?b)"                => "(* ?a (recip ?b))"),
        rewrite!("pow-2-to-square";           "(pow ?x ?e)"              => "(* ?x ?x)"               if scalar_is("?e", 2.0)),
        rewrite!("mul-const-right";           "(* ?c ?x)"                => "(* ?x ?c)"               if is_const("?c") if not_const("?x")),
        rewrite!("add-const-right";           "(+ ?c ?x)"                => "(+ ?x ?c)"               if is_const("?c") if not_const("?x")),
        rewrite!("scale-out-of-left-factor";  "(* (* ?x ?c) ?y)"         => "(* (* ?x ?y) ?c)"        if is_scalar("?c") if not_const("?y")),
        rewrite!("scale-out-of-right-factor"; "(* ?x (* ?y ?c))"         => "(* (* ?x ?y) ?c)"        if is_scalar("?c") if not_const("?x")),
        rewrite!("merge-scales";              "(* (* ?x ?a) ?b)"         => "(* ?x (* ?a ?b))"        if is_scalar("?a") if is_scalar("?b")),
        rewrite!("scale-out-of-matmul-lhs";   "(matmul (* ?a ?c) ?b)"    => "(* (matmul ?a ?b) ?c)"   if is_scalar("?c")),
        rewrite!("scale-out-of-matmul-rhs";   "(matmul ?a (* ?b ?c))"    => "(* (matmul ?a ?b) ?c)"   if is_scalar("?c")),
    ]
}
