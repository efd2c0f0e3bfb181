//! The convolutional-network family: `MaxPool`, `AveragePool`, `GlobalAveragePool`,
//! `GlobalMaxPool`, `BatchNormalization` (inference), `HardSigmoid`, `HardSwish`,
//! `Softplus`, `Mish`. The activations and the normalisation are written in pointwise ops
//! (which fuse with their neighbours); a normalisation's constants fold at import into one
//! scale and one shift per channel.

use ndarray::{ArrayD, IxDyn};

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::import::ImportError;
use crate::ir::{BinaryOp, NodeId, Op, PoolKind, PoolWindow, ReduceOp, Tensor, UnaryOp};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("MaxPool", pool);
    reg.insert("AveragePool", pool);
    reg.insert("GlobalAveragePool", global_pool);
    reg.insert("GlobalMaxPool", global_pool);
    reg.insert("BatchNormalization", batch_norm);
    reg.insert("HardSigmoid", hard_sigmoid);
    reg.insert("HardSwish", hard_swish);
    reg.insert("Softplus", softplus);
    reg.insert("Mish", mish);
}

/// A 2-D attribute (`strides`, `dilations`, `kernel_shape`), `default` for each where absent.
pub(super) fn pair(ctx: &NodeCtx, name: &str, default: usize) -> Result<[usize; 2], ImportError> {
    match ctx.attr_ints(name)?.as_deref() {
        None => Ok([default; 2]),
        Some([a, b]) if *a >= 0 && *b >= 0 => Ok([*a as usize, *b as usize]),
        Some(other) => Err(ctx.error(format!("{name} {other:?}: only 2-D windows are supported"))),
    }
}

/// The padding (top, left, bottom, right) of a 2-D window op: `pads`, or what `auto_pad`
/// asks for — `SAME_UPPER`/`SAME_LOWER` give `ceil(input / stride)` outputs, the odd pad at
/// the end or at the start.
pub(super) fn window_pads(
    ctx: &NodeCtx,
    input: [usize; 2],
    kernel: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
) -> Result<[usize; 4], ImportError> {
    match ctx.attr_string("auto_pad")?.as_deref() {
        None | Some("NOTSET") => match ctx.attr_ints("pads")?.as_deref() {
            None => Ok([0; 4]),
            Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => {
                Ok([p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize])
            }
            Some(p) => Err(ctx.error(format!("pads {p:?} are not four non-negative values"))),
        },
        Some("VALID") => Ok([0; 4]),
        Some(mode @ ("SAME_UPPER" | "SAME_LOWER")) => {
            let mut pads = [0; 4];
            for i in 0..2 {
                let stride = strides[i].max(1);
                let out = input[i].div_ceil(stride);
                let span = dilations[i] * kernel[i].saturating_sub(1) + 1;
                let total = ((out.max(1) - 1) * stride + span).saturating_sub(input[i]);
                let (small, large) = (total / 2, total - total / 2);
                (pads[i], pads[i + 2]) = if mode == "SAME_UPPER" { (small, large) } else { (large, small) };
            }
            Ok(pads)
        }
        Some(other) => Err(ctx.error(format!("unknown auto_pad \"{other}\""))),
    }
}

/// An error unless the node's outputs past the first are all left out.
fn first_output_only(ctx: &NodeCtx, what: &str) -> Result<(), ImportError> {
    if ctx.proto.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(ctx.error(format!("{what} is not supported (only the first output)")));
    }
    Ok(())
}

fn pool(ctx: &mut NodeCtx) -> Translated {
    let max = ctx.op_type() == "MaxPool";
    if max {
        first_output_only(ctx, "the Indices output")?;
    }
    let x = ctx.ty(0)?;
    if x.rank() != 4 {
        return Err(ctx.error(format!("only 2-D pooling (NCHW) is supported, X is {x}")));
    }
    let kernel = match ctx.attr_ints("kernel_shape")? {
        Some(_) => pair(ctx, "kernel_shape", 1)?,
        None => return Err(ctx.error("attribute 'kernel_shape' is required")),
    };
    let strides = pair(ctx, "strides", 1)?;
    let dilations = pair(ctx, "dilations", 1)?;
    let pads = window_pads(ctx, [x.shape[2], x.shape[3]], kernel, strides, dilations)?;
    let ceil_mode = ctx.attr_int("ceil_mode")?.unwrap_or(0) != 0;
    let kind = if max {
        PoolKind::Max
    } else {
        PoolKind::Average { count_include_pad: ctx.attr_int("count_include_pad")?.unwrap_or(0) != 0 }
    };
    let window = PoolWindow { kernel, strides, pads, dilations, ceil_mode, channels_last: false };
    let input = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Pool { kind, window }, &[input])?])
}

/// The mean or the largest element of each channel: a reduction over every axis after the
/// channels.
fn global_pool(ctx: &mut NodeCtx) -> Translated {
    let rank = ctx.rank(0)?;
    if rank < 3 {
        return Err(ctx.error(format!("{} needs an input of rank 3 or more, not {rank}", ctx.op_type())));
    }
    let op = if ctx.op_type() == "GlobalMaxPool" { ReduceOp::Max } else { ReduceOp::Mean };
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Reduce { op, axes: (2..rank).collect(), keep_dims: true }, &[x])?])
}

/// A scalar constant of `x`'s element type.
pub(super) fn scalar(ctx: &mut NodeCtx, x: NodeId, value: f64) -> NodeId {
    let dtype = ctx.graph.node(x).ty.dtype;
    ctx.constant(Tensor::from_f64(ArrayD::from_elem(IxDyn(&[]), value), dtype))
}

fn binary(ctx: &mut NodeCtx, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, ImportError> {
    ctx.add(Op::Binary(op), &[a, b])
}

/// `y = x·s + t` per channel, with `s = scale / √(var + ε)` and `t = B − mean·s` (folded to
/// constants where the statistics are constants, as exports have them).
fn batch_norm(ctx: &mut NodeCtx) -> Translated {
    if ctx.attr_int("training_mode")?.unwrap_or(0) != 0 {
        return Err(ctx.error("training_mode is set: only inference BatchNormalization is supported"));
    }
    first_output_only(ctx, "a training-mode output (running mean or variance)")?;
    let x_ty = ctx.ty(0)?;
    if x_ty.rank() < 2 {
        return Err(ctx.error(format!("BatchNormalization needs an input of rank 2 or more, X is {x_ty}")));
    }
    let channels = x_ty.shape[1];
    for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
        let ty = ctx.ty(i)?;
        if ty.shape != [channels] {
            return Err(ctx.error(format!("{what} is {ty}, not one value per channel ({channels})")));
        }
    }
    let epsilon = f64::from(ctx.attr_float("epsilon")?.unwrap_or(1e-5));
    let (x, scale, bias, mean, var) =
        (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?, ctx.input(3)?, ctx.input(4)?);
    let eps = scalar(ctx, var, epsilon);
    let var_eps = binary(ctx, BinaryOp::Add, var, eps)?;
    let root = ctx.add(Op::Unary(UnaryOp::Sqrt), &[var_eps])?;
    let s = binary(ctx, BinaryOp::Div, scale, root)?;
    let shifted = binary(ctx, BinaryOp::Mul, mean, s)?;
    let t = binary(ctx, BinaryOp::Sub, bias, shifted)?;
    // Per channel: [C, 1, …, 1] against X's [N, C, …].
    let mut shape = vec![channels];
    shape.resize(x_ty.rank() - 1, 1);
    let s = ctx.add(Op::Reshape { shape: shape.clone() }, &[s])?;
    let t = ctx.add(Op::Reshape { shape }, &[t])?;
    let scaled = binary(ctx, BinaryOp::Mul, x, s)?;
    Ok(vec![binary(ctx, BinaryOp::Add, scaled, t)?])
}

/// `max(0, min(1, α·x + β))`.
fn hard_sigmoid_of(ctx: &mut NodeCtx, x: NodeId, alpha: f64, beta: f64) -> Result<NodeId, ImportError> {
    let a = scalar(ctx, x, alpha);
    let b = scalar(ctx, x, beta);
    let ax = binary(ctx, BinaryOp::Mul, x, a)?;
    let shifted = binary(ctx, BinaryOp::Add, ax, b)?;
    ctx.add(Op::Clip { min: 0.0, max: 1.0 }, &[shifted])
}

fn hard_sigmoid(ctx: &mut NodeCtx) -> Translated {
    let alpha = f64::from(ctx.attr_float("alpha")?.unwrap_or(0.2));
    let beta = f64::from(ctx.attr_float("beta")?.unwrap_or(0.5));
    let x = ctx.input(0)?;
    Ok(vec![hard_sigmoid_of(ctx, x, alpha, beta)?])
}

/// `x · HardSigmoid(x)` with α = 1/6, β = 1/2.
fn hard_swish(ctx: &mut NodeCtx) -> Translated {
    let x = ctx.input(0)?;
    let gate = hard_sigmoid_of(ctx, x, f64::from(1.0f32 / 6.0), 0.5)?;
    Ok(vec![binary(ctx, BinaryOp::Mul, x, gate)?])
}

/// `ln(1 + eˣ)`.
fn softplus_of(ctx: &mut NodeCtx, x: NodeId) -> Result<NodeId, ImportError> {
    let e = ctx.add(Op::Unary(UnaryOp::Exp), &[x])?;
    let one = scalar(ctx, x, 1.0);
    let sum = binary(ctx, BinaryOp::Add, e, one)?;
    ctx.add(Op::Unary(UnaryOp::Log), &[sum])
}

fn softplus(ctx: &mut NodeCtx) -> Translated {
    let x = ctx.input(0)?;
    Ok(vec![softplus_of(ctx, x)?])
}

/// `x · tanh(softplus(x))`.
fn mish(ctx: &mut NodeCtx) -> Translated {
    let x = ctx.input(0)?;
    let soft = softplus_of(ctx, x)?;
    let tanh = ctx.add(Op::Unary(UnaryOp::Tanh), &[soft])?;
    Ok(vec![binary(ctx, BinaryOp::Mul, x, tanh)?])
}
