//! The rule sets, one file per topic. Rules are data: `rewrite!("name"; lhs => rhs if …)`.
//! No blanket commutativity or associativity: constants are moved to the right and scalar
//! scales outwards (canonical.rs), and the recognition rules spell out the operand orders
//! exporters produce.

mod attention;
mod canonical;
mod cleanup;
mod conditions;
mod gelu;
mod norm;
mod rotary;
mod softmax;

use egg::{Id, Rewrite, Var};

use super::analysis::{FusionAnalysis, FusionGraph};
use super::lang::FusionLang;

/// One rewrite rule of the fusion's rule sets.
pub type Rule = Rewrite<FusionLang, FusionAnalysis>;

/// A pattern variable of a custom applier (`"?x"`).
fn pattern_var(name: &str) -> Var {
    name.parse().unwrap_or_else(|_| panic!("'{name}' is not a pattern variable"))
}

/// Unions an applier's result with the matched class; returns the class if that changed it.
fn union_with_match(egraph: &mut FusionGraph, matched: Id, result: Id) -> Vec<Id> {
    if egraph.union(matched, result) {
        vec![matched]
    } else {
        vec![]
    }
}

/// Every rule, in topic order.
pub fn all() -> Vec<Rule> {
    let mut rules = canonical::rules();
    rules.extend(cleanup::rules());
    rules.extend(norm::rules());
    rules.extend(gelu::rules());
    rules.extend(softmax::rules());
    rules.extend(attention::rules());
    rules.extend(rotary::rules());
    rules
}

/// The rule sets by topic, for tests and reports.
pub fn by_topic() -> Vec<(&'static str, Vec<Rule>)> {
    vec![
        ("canonical", canonical::rules()),
        ("cleanup", cleanup::rules()),
        ("norm", norm::rules()),
        ("gelu", gelu::rules()),
        ("softmax", softmax::rules()),
        ("attention", attention::rules()),
        ("rotary", rotary::rules()),
    ]
}
