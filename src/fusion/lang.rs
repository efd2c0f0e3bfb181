//! The e-graph language: the IR ops rules reason about get their own node; every other op is
//! `Other`, an interned IR op over its children, so the whole graph lives in the e-graph.

use std::fmt;
use std::str::FromStr;

use egg::{define_language, Id};

macro_rules! leaf_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                s.strip_prefix($prefix).and_then(|n| n.parse().ok()).map($name).ok_or(())
            }
        }
    };
}

leaf_id!(
    /// A constant in the analysis's table (`c12`).
    ConstId,
    "c"
);
leaf_id!(
    /// A graph input (`in0`).
    InputId,
    "in"
);
leaf_id!(
    /// An IR op in the analysis's table, for `Other` nodes (`op3`).
    OpId,
    "op"
);

/// A transpose's permutation (`perm0.2.1.3`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Perm(pub Vec<usize>);

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self.0.iter().map(|a| a.to_string()).collect();
        write!(f, "perm{}", axes.join("."))
    }
}

impl FromStr for Perm {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let axes = s.strip_prefix("perm").ok_or(())?;
        axes.split('.').map(|a| a.parse().map_err(|_| ())).collect::<Result<_, _>>().map(Perm)
    }
}

define_language! {
    /// The e-graph's language: the IR's ops over tensors, plus the fused ops rules make.
    ///
    /// Reductions (`mean`, `sum`, `max`) and `softmax` run over the last axis and keep it.
    /// `variance` and `softmax_nan0` exist only inside patterns: extraction never picks them.
    /// Each variant is named by its operator in the list below (egg's macro takes no
    /// attributes on variants, so they carry no doc comments of their own).
    #[allow(missing_docs)]
    pub enum FusionLang {
        "+" = Add([Id; 2]),
        "-" = Sub([Id; 2]),
        "*" = Mul([Id; 2]),
        "/" = Div([Id; 2]),
        "pow" = Pow([Id; 2]),
        "neg" = Neg([Id; 1]),
        "sqrt" = Sqrt([Id; 1]),
        "recip" = Recip([Id; 1]),
        "exp" = Exp([Id; 1]),
        "erf" = Erf([Id; 1]),
        "tanh" = Tanh([Id; 1]),
        "isnan" = IsNaN([Id; 1]),
        "nan0" = NanToZero([Id; 1]),
        "mean" = Mean([Id; 1]),
        "sum" = Sum([Id; 1]),
        "max" = Max([Id; 1]),
        "softmax" = Softmax([Id; 1]),
        "matmul" = MatMul([Id; 2]),
        "transpose" = Transpose([Id; 2]),
        "where" = Where([Id; 3]),
        "dropout" = Dropout([Id; 1]),
        "identity" = Identity([Id; 1]),
        "variance" = Variance([Id; 1]),
        "softmax_nan0" = SoftmaxNanToZero([Id; 1]),
        // x, scale|none, bias|none, eps
        "layer_norm" = LayerNorm([Id; 4]),
        // x, scale|none, eps
        "rms_norm" = RmsNorm([Id; 3]),
        "gelu" = Gelu([Id; 1]),
        "gelu_tanh" = GeluTanh([Id; 1]),
        "rotate_half" = RotateHalf([Id; 1]),
        // q, kt, v, mask|none, scale
        "attention" = Attention([Id; 5]),
        "attention_nan0" = AttentionNanToZero([Id; 5]),
        "none" = Absent,
        Const(ConstId),
        Input(InputId),
        Perm(Perm),
        Other(OpId, Vec<Id>),
    }
}
