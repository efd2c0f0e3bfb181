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
mod softmax;

use egg::Rewrite;

use super::analysis::FusionAnalysis;
use super::lang::FusionLang;

pub type Rule = Rewrite<FusionLang, FusionAnalysis>;

/// Every rule, in topic order.
pub fn all() -> Vec<Rule> {
    let mut rules = canonical::rules();
    rules.extend(cleanup::rules());
    rules.extend(norm::rules());
    rules.extend(gelu::rules());
    rules.extend(softmax::rules());
    rules.extend(attention::rules());
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
    ]
}
