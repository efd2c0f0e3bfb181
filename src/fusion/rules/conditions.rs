//! Conditions for rules, as small factories over pattern variables.

use egg::{Id, Subst, Var};

use crate::fusion::analysis::{Data, FusionGraph};

use super::pattern_var as var;

fn data<'a>(egraph: &'a FusionGraph, subst: &Subst, v: Var) -> &'a Data {
    &egraph[subst[v]].data
}

/// Constants compared with patterns' literals agree to f32 precision.
fn close(value: f64, want: f64) -> bool {
    (value - want).abs() <= 1e-6 * want.abs().max(1e-30) + 1e-9
}

/// `name` is a one-element constant close to `value`.
pub fn scalar_is(name: &str, value: f64) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, _, s| matches!(&data(eg, s, v).constant, Some(c) if c.len() == 1 && close(c.to_f64_vec()[0], value))
}

/// `name` is a one-element floating-point constant.
pub fn is_scalar(name: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, _, s| matches!(&data(eg, s, v).constant, Some(c) if c.len() == 1 && c.dtype().is_float())
}

/// Every element of constant `name` is exactly `value`.
pub fn all_equal(name: &str, value: f64) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, _, s| {
        let Some(c) = data(eg, s, v).constant.clone() else { return false };
        eg.analysis.all_equal(&c, value)
    }
}

pub fn is_const(name: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, _, s| data(eg, s, v).constant.is_some()
}

pub fn not_const(name: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, _, s| data(eg, s, v).ty.is_some() && data(eg, s, v).constant.is_none()
}

/// `name` has the same type as the matched class: dropping the op around it changes nothing.
pub fn same_type_as_match(name: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, id, s| data(eg, s, v).ty.is_some() && data(eg, s, v).ty == eg[id].data.ty
}

/// `param` is a per-feature constant of row-op input `x`: as many elements as `x`'s last
/// dimension, laid along the last axis.
pub fn row_param(param: &str, x: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let (p, x) = (var(param), var(x));
    move |eg, _, s| {
        let (Some(c), Some(xt)) = (&data(eg, s, p).constant, &data(eg, s, x).ty) else { return false };
        let width = xt.shape.last().copied().unwrap_or(0);
        let shape = c.shape();
        c.dtype() == xt.dtype
            && shape.last() == Some(&width)
            && shape.len() <= xt.rank()
            && shape[..shape.len() - 1].iter().all(|&d| d == 1)
    }
}

/// `name` is a floating-point tensor (not `none`, not a permutation).
pub fn is_float(name: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let v = var(name);
    move |eg, _, s| matches!(&data(eg, s, v).ty, Some(t) if t.dtype.is_float())
}

/// `mask` is a float tensor that broadcasts to the scores `q · kt` (`[.., S, T]`).
pub fn mask_fits_scores(mask: &str, q: &str, kt: &str) -> impl Fn(&mut FusionGraph, Id, &Subst) -> bool {
    let (m, q, k) = (var(mask), var(q), var(kt));
    move |eg, _, s| {
        let (Some(mt), Some(qt), Some(kt)) = (&data(eg, s, m).ty, &data(eg, s, q).ty, &data(eg, s, k).ty)
        else {
            return false;
        };
        let (Some(&rows), Some(&cols)) = (qt.shape.iter().rev().nth(1), kt.shape.last()) else {
            return false;
        };
        let batch = qt.rank().max(kt.rank()) - 2;
        let fits =
            |dims: &[usize]| mt.shape.iter().rev().zip(dims.iter().rev()).all(|(&a, &b)| a == b || a == 1);
        mt.dtype == qt.dtype
            && mt.rank() <= batch + 2
            && fits(&[rows, cols])
            && mt
                .shape
                .iter()
                .rev()
                .skip(2)
                .zip(qt.shape.iter().rev().skip(2))
                .all(|(&a, &b)| a == b || a == 1)
    }
}
