//! Ops that do nothing at inference: Dropout, Identity, x·1, x+0, transpose pairs.

use egg::{rewrite, Applier, Id, PatternAst, Subst, Symbol, Var};

use super::conditions::{all_equal, same_type_as_match};
use super::{pattern_var, union_with_match, Rule};
use crate::fusion::analysis::FusionGraph;
use crate::fusion::lang::{FusionLang, Perm};

#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    vec![
        rewrite!("remove-dropout";  "(dropout ?x)"  => "?x"),
        rewrite!("remove-identity"; "(identity ?x)" => "?x"),
        rewrite!("mul-by-one";      "(* ?x ?c)"     => "?x" if all_equal("?c", 1.0) if same_type_as_match("?x")),
        rewrite!("add-zero";        "(+ ?x ?c)"     => "?x" if all_equal("?c", 0.0) if same_type_as_match("?x")),
        rewrite!("transpose-pair";  "(transpose (transpose ?x ?p) ?q)" => { ComposeTransposes::new() }),
    ]
}

/// transpose(transpose(x, p), q) is x when the permutations cancel, else one transpose.
struct ComposeTransposes {
    x: Var,
    p: Var,
    q: Var,
}

impl ComposeTransposes {
    fn new() -> Self {
        ComposeTransposes { x: pattern_var("?x"), p: pattern_var("?p"), q: pattern_var("?q") }
    }
}

impl Applier<FusionLang, crate::fusion::analysis::FusionAnalysis> for ComposeTransposes {
    fn apply_one(
        &self,
        egraph: &mut FusionGraph,
        matched: Id,
        subst: &Subst,
        _: Option<&PatternAst<FusionLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let (Some(p), Some(q)) =
            (egraph[subst[self.p]].data.perm.clone(), egraph[subst[self.q]].data.perm.clone())
        else {
            return vec![];
        };
        let composed: Vec<usize> = q.iter().map(|&i| p[i]).collect();
        let result = if composed.iter().enumerate().all(|(i, &a)| i == a) {
            subst[self.x]
        } else {
            let perm = egraph.add(FusionLang::Perm(Perm(composed)));
            egraph.add(FusionLang::Transpose([subst[self.x], perm]))
        };
        union_with_match(egraph, matched, result)
    }
}
