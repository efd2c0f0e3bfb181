//! The operations of the IR. They keep ONNX's meaning, with every attribute that ONNX passes
//! as a constant input (axes, shapes, repeats, …) resolved into a static field, and every
//! axis normalised to be non-negative. Each op has one output.

use std::fmt;
use std::sync::Arc;

use super::dtype::DType;
use super::tensor::Tensor;

/// An elementwise op of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `√x`.
    Sqrt,
    /// `1 / x`.
    Reciprocal,
    /// `eˣ`.
    Exp,
    /// Natural logarithm.
    Log,
    /// The error function.
    Erf,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e⁻ˣ)`.
    Sigmoid,
    /// `max(x, 0)`.
    Relu,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Logical not (bool).
    Not,
    /// Whether `x` is NaN (bool).
    IsNaN,
    /// `x`, or 0 where `x` is NaN: the exporters' `Where(IsNaN(s), 0, s)` guard after a
    /// softmax, as one op (no ONNX op of its own).
    NanToZero,
    /// ONNX `Gelu` with `approximate="none"` (erf form).
    Gelu,
    /// ONNX `Gelu` with `approximate="tanh"`.
    GeluTanh,
}

/// An elementwise op of two inputs (ONNX's multidirectional broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b` (integer division truncates).
    Div,
    /// `aᵇ`.
    Pow,
    /// The remainder with the divisor's sign, `a − b·⌊a/b⌋` (ONNX `Mod`, `fmod=0`; Python's `%`).
    Mod,
    /// The remainder with the dividend's sign, `a − b·trunc(a/b)` (ONNX `Mod`, `fmod=1`; C's
    /// `fmod`).
    Fmod,
    /// The smaller.
    Min,
    /// The larger.
    Max,
    /// `a == b` (bool).
    Equal,
    /// `a < b` (bool).
    Less,
    /// `a <= b` (bool).
    LessOrEqual,
    /// `a > b` (bool).
    Greater,
    /// `a >= b` (bool).
    GreaterOrEqual,
    /// Logical and (bool).
    And,
}

impl BinaryOp {
    /// Whether it compares (its output is bool).
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal
                | BinaryOp::Less
                | BinaryOp::LessOrEqual
                | BinaryOp::Greater
                | BinaryOp::GreaterOrEqual
        )
    }
}

/// How a `Reduce` combines the elements of its axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// The mean.
    Mean,
    /// The sum.
    Sum,
    /// The largest.
    Max,
}

/// How a `Pool` combines the elements of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// The largest element inside the input (padding never counts).
    Max,
    /// The mean: of the elements inside the input, or (`count_include_pad`) of those inside
    /// the explicitly padded input, padding counting as zeros.
    Average {
        /// Padding counts in the divisor.
        count_include_pad: bool,
    },
}

/// The windows of a 2-D `Pool` over NCHW (or NHWC, `channels_last`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolWindow {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Strides along height and width.
    pub strides: [usize; 2],
    /// Padding: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Dilations along height and width.
    pub dilations: [usize; 2],
    /// Output extents round up (a last window that starts in the input or its start
    /// padding is kept), not down.
    pub ceil_mode: bool,
    /// Input and output are NHWC (the `channels-last` pass's layout).
    pub channels_last: bool,
}

/// One axis of a `Slice`: the output takes `len` elements, `start`, `start + step`, ….
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceAxis {
    /// The first element taken.
    pub start: usize,
    /// The distance between elements taken (negative: backwards).
    pub step: i64,
    /// How many are taken.
    pub len: usize,
}

/// One IR operation (one output).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A graph input, fed at run time.
    Input {
        /// The ONNX input's name.
        name: String,
    },
    /// A constant (weights, folded shape arithmetic).
    Constant(Arc<Tensor>),
    /// One input, elementwise.
    Unary(UnaryOp),
    /// Two inputs, multidirectional broadcasting.
    Binary(BinaryOp),
    /// `Where(cond, x, y)`, broadcasting.
    Where,
    /// Element type conversion.
    Cast {
        /// The type converted to.
        to: DType,
    },
    /// `min`/`max` are infinite where ONNX leaves them out.
    Clip {
        /// The lower bound.
        min: f64,
        /// The upper bound.
        max: f64,
    },
    /// Inference dropout: the identity, kept so that fusion can account for it.
    Dropout,
    /// The identity.
    Identity,
    /// numpy `matmul` semantics (batch broadcasting, 1-D promotion).
    MatMul,
    /// `alpha · op(A) · op(B) + beta · C`; C is an optional third input.
    Gemm {
        /// Scale of the product.
        alpha: f32,
        /// Scale of C.
        beta: f32,
        /// A is read transposed.
        trans_a: bool,
        /// B is read transposed.
        trans_b: bool,
    },
    /// 2-D convolution, NCHW (or NHWC input and output with KRSC filters, `channels_last`);
    /// bias is an optional third input.
    Conv {
        /// Strides along height and width.
        strides: [usize; 2],
        /// Padding: top, left, bottom, right.
        pads: [usize; 4],
        /// Dilations along height and width.
        dilations: [usize; 2],
        /// Groups the channels are split into.
        group: usize,
        /// Input and output NHWC, filters `[K, R, S, C / group]` (the layout pass's choice for
        /// half types).
        channels_last: bool,
    },
    /// 2-D pooling (max or average) over windows of NCHW.
    Pool {
        /// How a window's elements combine.
        kind: PoolKind,
        /// The windows.
        window: PoolWindow,
    },
    /// Softmax along `axis`.
    Softmax {
        /// The axis.
        axis: usize,
    },
    /// Log-softmax along `axis`.
    LogSoftmax {
        /// The axis.
        axis: usize,
    },
    /// Normalises over `axis..rank`; inputs x, optional scale, optional bias (bias only after
    /// a scale).
    LayerNorm {
        /// The first axis normalised over.
        axis: usize,
        /// Added to the variance.
        epsilon: f32,
    },
    /// `x / sqrt(mean(x², axis..rank) + eps) · scale`; inputs x, optional scale. With
    /// `deviation`, `x / sqrt(var(x, axis..rank) + eps)`: a LayerNorm whose mean is not taken
    /// out of x, which [`crate::passes::FoldNormScales`] leaves before products whose weights'
    /// columns sum to zero (so that the mean would add nothing to them).
    RmsNorm {
        /// The first axis normalised over.
        axis: usize,
        /// Added to the mean square (the variance, with `deviation`).
        epsilon: f32,
        /// The root mean square taken of x's deviations from its mean, x itself unchanged.
        deviation: bool,
    },
    /// `softmax(scale · q·kt + mask) · v` over the last axis; inputs q `[.., S, D]`,
    /// kt `[.., D, T]` (keys already transposed), v `[.., T, Dv]`, optional additive mask
    /// broadcasting to `[.., S, T]`. With `nan_to_zero`, rows that come out NaN (every score
    /// masked to -inf) are zero, as the IsNaN/Where guard of some exporters makes them.
    Attention {
        /// Multiplies the scores.
        scale: f32,
        /// Rows that come out NaN are zero.
        nan_to_zero: bool,
    },
    /// A reduction over `axes`.
    Reduce {
        /// How the elements combine.
        op: ReduceOp,
        /// The axes reduced.
        axes: Vec<usize>,
        /// Reduced axes stay, of size 1.
        keep_dims: bool,
    },
    /// Running sum along `axis`.
    CumSum {
        /// The axis.
        axis: usize,
        /// Each element leaves itself out of its sum.
        exclusive: bool,
        /// Summed from the end.
        reverse: bool,
    },
    /// The same elements in another shape.
    Reshape {
        /// The new shape.
        shape: Vec<usize>,
    },
    /// Axes permuted.
    Transpose {
        /// Output axis `i` is input axis `perm[i]`.
        perm: Vec<usize>,
    },
    /// Inputs joined along `axis`.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// `Concat(past, new)` along `axis` where `past` is a graph input stored inside this
    /// value's own buffer (a key/value cache, `passes::CacheInPlace`): the same value, but its
    /// kernel writes only `new`'s part, after the `past` already there.
    Append {
        /// The axis.
        axis: usize,
    },
    /// One entry per input axis.
    Slice {
        /// What each axis keeps.
        axes: Vec<SliceAxis>,
    },
    /// Inputs data, indices (i64/i32, negative counts from the end).
    Gather {
        /// The axis indexed.
        axis: usize,
    },
    /// Inputs data, indices of the data's rank: each output element is data at the
    /// indices' coordinates with `axis` replaced by the index.
    GatherElements {
        /// The axis indexed.
        axis: usize,
    },
    /// Inputs data, indices: each row of the indices' last axis (`k` values, negative counting
    /// from the end) addresses data's axes `batch_dims..batch_dims + k`; the first
    /// `batch_dims` axes of both are shared.
    GatherNd {
        /// Leading axes shared by data and indices.
        batch_dims: usize,
    },
    /// Bidirectional broadcast to `shape`.
    Expand {
        /// The shape broadcast to.
        shape: Vec<usize>,
    },
    /// The input repeated along each axis.
    Tile {
        /// Copies along each axis.
        repeats: Vec<usize>,
    },
    /// The upper or lower triangle of the last two axes, the rest zero.
    Trilu {
        /// The upper triangle (else the lower).
        upper: bool,
        /// The diagonal's offset.
        k: i64,
    },
    /// The rotate-half of rotary position embeddings over the last axis (of even size 2h):
    /// `concat(-x[.., h:], x[.., :h])`, as exporters spell it with two slices, a negation
    /// and a concat.
    RotateHalf,
    /// A squeeze-and-excitation gate after its pool's first stage (`ops/gate.rs`): inputs x,
    /// w1, b1, w2, b2, and the projection's weights it is folded into where it is.
    ChannelGate {
        /// The activation between the two products.
        hidden: super::ops::gate::GateActivation,
        /// The activation of the gate.
        gate: super::ops::gate::GateActivation,
    },
}

impl Op {
    /// Whether the op is a view: it moves no data, readers can index through it.
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::Expand { .. }
                | Op::Identity
                | Op::Dropout
        )
    }

    /// Whether each element of the op's output is computed from its inputs' elements at the
    /// same (broadcast) coordinates, and from nothing else.
    pub fn is_pointwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } | Op::Clip { .. })
    }

    /// The op's name in dumps and histograms (stable, one word).
    pub fn kind(&self) -> String {
        match self {
            Op::Input { .. } => "Input".into(),
            Op::Constant(_) => "Constant".into(),
            Op::Unary(u) => format!("{u:?}"),
            Op::Binary(b) => format!("{b:?}"),
            Op::Where => "Where".into(),
            Op::Cast { .. } => "Cast".into(),
            Op::Clip { .. } => "Clip".into(),
            Op::Dropout => "Dropout".into(),
            Op::Identity => "Identity".into(),
            Op::MatMul => "MatMul".into(),
            Op::Gemm { .. } => "Gemm".into(),
            Op::Conv { .. } => "Conv".into(),
            Op::Pool { kind: PoolKind::Max, .. } => "MaxPool".into(),
            Op::Pool { kind: PoolKind::Average { .. }, .. } => "AveragePool".into(),
            Op::Softmax { .. } => "Softmax".into(),
            Op::LogSoftmax { .. } => "LogSoftmax".into(),
            Op::LayerNorm { .. } => "LayerNorm".into(),
            Op::RmsNorm { .. } => "RmsNorm".into(),
            Op::Attention { .. } => "Attention".into(),
            Op::Reduce { op, .. } => format!("Reduce{op:?}"),
            Op::CumSum { .. } => "CumSum".into(),
            Op::Reshape { .. } => "Reshape".into(),
            Op::Transpose { .. } => "Transpose".into(),
            Op::Concat { .. } => "Concat".into(),
            Op::Append { .. } => "Append".into(),
            Op::Slice { .. } => "Slice".into(),
            Op::Gather { .. } => "Gather".into(),
            Op::GatherElements { .. } => "GatherElements".into(),
            Op::GatherNd { .. } => "GatherND".into(),
            Op::Expand { .. } => "Expand".into(),
            Op::Tile { .. } => "Tile".into(),
            Op::Trilu { .. } => "Trilu".into(),
            Op::RotateHalf => "RotateHalf".into(),
            Op::ChannelGate { .. } => "ChannelGate".into(),
        }
    }

    /// How many inputs the op takes: (least, most).
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input { .. } | Op::Constant(_) => (0, 0),
            Op::Binary(_)
            | Op::MatMul
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::Append { .. } => (2, 2),
            Op::Where => (3, 3),
            Op::Gemm { .. } | Op::Conv { .. } => (2, 3),
            Op::LayerNorm { .. } => (1, 3),
            Op::RmsNorm { .. } => (1, 2),
            Op::Attention { .. } => (3, 4),
            Op::ChannelGate { .. } => (5, 6),
            Op::Concat { .. } => (1, usize::MAX),
            _ => (1, 1),
        }
    }
}

/// Attributes as the text dump prints them, after the op's kind.
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind();
        match self {
            Op::Input { name } => write!(f, "Input \"{name}\""),
            Op::Cast { to } => write!(f, "{kind}<{to}>"),
            Op::Clip { min, max } => write!(f, "{kind}<{min}, {max}>"),
            Op::Gemm { alpha, beta, trans_a, trans_b } => {
                write!(f, "{kind}<alpha={alpha}, beta={beta}, ta={trans_a}, tb={trans_b}>")
            }
            Op::Conv { strides, pads, dilations, group, channels_last } => write!(
                f,
                "{kind}<strides={strides:?}, pads={pads:?}, dilations={dilations:?}, group={group}{}>",
                if *channels_last { ", NHWC" } else { "" }
            ),
            Op::Pool { kind, window } => {
                let PoolWindow { kernel, strides, pads, dilations, ceil_mode, channels_last } = window;
                let include = match kind {
                    PoolKind::Average { count_include_pad } => {
                        format!(", count_include_pad={count_include_pad}")
                    }
                    PoolKind::Max => String::new(),
                };
                write!(
                    f,
                    "{kind}<kernel={kernel:?}, strides={strides:?}, pads={pads:?}, dilations={dilations:?}, ceil={ceil_mode}{include}{}>",
                    if *channels_last { ", NHWC" } else { "" },
                    kind = self.kind()
                )
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Concat { axis } | Op::Append { axis } => {
                write!(f, "{kind}<axis={axis}>")
            }
            Op::Gather { axis } | Op::GatherElements { axis } => write!(f, "{kind}<axis={axis}>"),
            Op::GatherNd { batch_dims } => write!(f, "{kind}<batch_dims={batch_dims}>"),
            Op::LayerNorm { axis, epsilon } | Op::RmsNorm { axis, epsilon, deviation: false } => {
                write!(f, "{kind}<axis={axis}, eps={epsilon:e}>")
            }
            Op::RmsNorm { axis, epsilon, deviation: true } => {
                write!(f, "{kind}<axis={axis}, eps={epsilon:e}, deviation>")
            }
            Op::Attention { scale, nan_to_zero } => {
                write!(f, "{kind}<scale={scale}, nan_to_zero={nan_to_zero}>")
            }
            Op::Reduce { axes, keep_dims, .. } => {
                write!(f, "{kind}<axes={axes:?}, keep_dims={keep_dims}>")
            }
            Op::CumSum { axis, exclusive, reverse } => {
                write!(f, "{kind}<axis={axis}, exclusive={exclusive}, reverse={reverse}>")
            }
            Op::Reshape { shape } | Op::Expand { shape } => write!(f, "{kind}<{shape:?}>"),
            Op::Transpose { perm } => write!(f, "{kind}<{perm:?}>"),
            Op::Tile { repeats } => write!(f, "{kind}<{repeats:?}>"),
            Op::Slice { axes } => {
                let parts: Vec<String> =
                    axes.iter().map(|a| format!("{}:{}:{}", a.start, a.step, a.len)).collect();
                write!(f, "{kind}<{}>", parts.join(", "))
            }
            Op::Trilu { upper, k } => write!(f, "{kind}<upper={upper}, k={k}>"),
            Op::ChannelGate { hidden, gate } => write!(f, "{kind}<{hidden:?}, {gate:?}>"),
            _ => f.write_str(&kind),
        }
    }
}
