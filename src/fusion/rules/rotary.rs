//! Rotary position embeddings. Exporters spell the rotate-half, `concat(-x[.., h:], x[.., :h])`
//! over the last axis, as two slices, a negation and a concat; it becomes one `rotate_half`,
//! which the pointwise kernel of the rotation (`x·cos + rotate_half(x)·sin`) reads from `x`
//! directly, so no half and no concat is written out.

use egg::{rewrite, Id, SearchMatches, Searcher, Subst, Var};

use super::{pattern_var, Rule};
use crate::fusion::analysis::{FusionAnalysis, FusionGraph};
use crate::fusion::lang::FusionLang;
use crate::ir::Op;

pub fn rules() -> Vec<Rule> {
    vec![rewrite!("rotate-half"; { HalvesSwapped::new() } => "(rotate_half ?x)")]
}

/// Matches `concat(neg(slice(x, h..2h)), slice(x, 0..h))` along the last axis, where both
/// slices keep every other axis of `x` whole; binds `?x`.
struct HalvesSwapped {
    x: Var,
}

impl HalvesSwapped {
    fn new() -> Self {
        HalvesSwapped { x: pattern_var("?x") }
    }
}

/// The inputs `x` of the slices in `class` that keep elements `start..start + len` of the
/// last axis of `x` (whose size is `2·len`) and every other axis whole.
fn half_slices(egraph: &FusionGraph, class: Id, start: usize, len: usize) -> Vec<Id> {
    egraph[class]
        .nodes
        .iter()
        .filter_map(|node| {
            let FusionLang::Other(op, children) = node else { return None };
            let Op::Slice { axes } = egraph.analysis.op(*op) else { return None };
            let x = *children.first()?;
            let shape = &egraph[x].data.ty.as_ref()?.shape;
            let (last, rest) = axes.split_last()?;
            let whole = rest.len() + 1 == shape.len()
                && rest.iter().zip(shape).all(|(a, &d)| a.start == 0 && a.step == 1 && a.len == d);
            let half = last.start == start && last.step == 1 && last.len == len;
            (whole && half && shape.last() == Some(&(2 * len))).then(|| egraph.find(x))
        })
        .collect()
}

impl Searcher<FusionLang, FusionAnalysis> for HalvesSwapped {
    fn search_eclass_with_limit(
        &self,
        egraph: &FusionGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, FusionLang>> {
        let ty = egraph[eclass].data.ty.as_ref()?;
        let width = *ty.shape.last()?;
        if width % 2 != 0 {
            return None;
        }
        let half = width / 2;
        let mut substs = Vec::new();
        for node in &egraph[eclass].nodes {
            let FusionLang::Other(op, children) = node else { continue };
            let (Op::Concat { axis }, [negated, kept]) = (egraph.analysis.op(*op), children.as_slice())
            else {
                continue;
            };
            if axis + 1 != ty.rank() {
                continue;
            }
            let kept = half_slices(egraph, *kept, 0, half);
            for sliced in egraph[*negated].nodes.iter().filter_map(|n| match n {
                FusionLang::Neg([s]) => Some(*s),
                _ => None,
            }) {
                for x in half_slices(egraph, sliced, half, half) {
                    if kept.contains(&x) && substs.len() < limit {
                        let mut subst = Subst::with_capacity(1);
                        subst.insert(self.x, x);
                        substs.push(subst);
                    }
                }
            }
        }
        (!substs.is_empty()).then_some(SearchMatches { eclass, substs, ast: None })
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.x]
    }
}
