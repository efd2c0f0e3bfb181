//! The piecewise activations of ONNX's default domain that detection, face and older
//! classification networks use: `LeakyRelu` (YOLO), `PRelu`, `Elu`, `Selu`, `Celu`,
//! `ThresholdedRelu`, `Softsign`, `Shrink`. Each is written in pointwise ops — a comparison
//! choosing between two branches through `Where` — which fuse with their neighbours (a
//! convolution's epilogue, a pointwise chain). A NaN takes the branch the ONNX definition's
//! comparison gives it, so it comes out NaN.

use super::vision::scalar;
use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::import::ImportError;
use crate::ir::{BinaryOp, NodeId, Op, UnaryOp};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("LeakyRelu", leaky_relu);
    reg.insert("PRelu", prelu);
    reg.insert("Elu", elu);
    reg.insert("Selu", selu);
    reg.insert("Celu", celu);
    reg.insert("ThresholdedRelu", thresholded_relu);
    reg.insert("Softsign", softsign);
    reg.insert("Shrink", shrink);
}

fn binary(ctx: &mut NodeCtx, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, ImportError> {
    ctx.add(Op::Binary(op), &[a, b])
}

/// A float attribute, `default` where absent.
fn float(ctx: &NodeCtx, name: &str, default: f32) -> Result<f64, ImportError> {
    Ok(f64::from(ctx.attr_float(name)?.unwrap_or(default)))
}

/// `x` where `x < 0` is false, else `negative`.
fn below_zero(ctx: &mut NodeCtx, x: NodeId, negative: NodeId) -> Result<NodeId, ImportError> {
    let zero = scalar(ctx, x, 0.0);
    let less = binary(ctx, BinaryOp::Less, x, zero)?;
    ctx.add(Op::Where, &[less, negative, x])
}

/// `α · (eˣ − 1)`, `x` divided by `divisor` first where given (Celu).
fn exp_minus_one(
    ctx: &mut NodeCtx,
    x: NodeId,
    alpha: f64,
    divisor: Option<f64>,
) -> Result<NodeId, ImportError> {
    let scaled = match divisor {
        Some(d) => {
            let d = scalar(ctx, x, d);
            binary(ctx, BinaryOp::Div, x, d)?
        }
        None => x,
    };
    let e = ctx.add(Op::Unary(UnaryOp::Exp), &[scaled])?;
    let one = scalar(ctx, x, 1.0);
    let less = binary(ctx, BinaryOp::Sub, e, one)?;
    let alpha = scalar(ctx, x, alpha);
    binary(ctx, BinaryOp::Mul, less, alpha)
}

/// `x` for `x ≥ 0`, `α·x` below.
fn leaky_relu(ctx: &mut NodeCtx) -> Translated {
    let alpha = float(ctx, "alpha", 0.01)?;
    let x = ctx.input(0)?;
    let a = scalar(ctx, x, alpha);
    let scaled = binary(ctx, BinaryOp::Mul, x, a)?;
    Ok(vec![below_zero(ctx, x, scaled)?])
}

/// `x` for `x ≥ 0`, `slope·x` below; `slope` broadcast to `x`.
fn prelu(ctx: &mut NodeCtx) -> Translated {
    let (x, slope) = (ctx.input(0)?, ctx.input(1)?);
    let (x_ty, slope_ty) = (ctx.ty(0)?, ctx.ty(1)?);
    if slope_ty.rank() > x_ty.rank() {
        return Err(ctx.error(format!("slope {slope_ty} does not broadcast to X {x_ty}")));
    }
    let scaled = binary(ctx, BinaryOp::Mul, x, slope)?;
    if ctx.graph.node(scaled).ty.shape != x_ty.shape {
        return Err(
            ctx.error(format!("slope {slope_ty} does not broadcast to X {x_ty} (only X may be the wider)"))
        );
    }
    Ok(vec![below_zero(ctx, x, scaled)?])
}

/// `x` for `x ≥ 0`, `α·(eˣ − 1)` below.
fn elu(ctx: &mut NodeCtx) -> Translated {
    let alpha = float(ctx, "alpha", 1.0)?;
    let x = ctx.input(0)?;
    let negative = exp_minus_one(ctx, x, alpha, None)?;
    Ok(vec![below_zero(ctx, x, negative)?])
}

/// `γ·x` for `x > 0`, `γ·α·(eˣ − 1)` otherwise.
fn selu(ctx: &mut NodeCtx) -> Translated {
    let alpha = float(ctx, "alpha", 1.673_263_2)?;
    let gamma = float(ctx, "gamma", 1.050_701)?;
    let x = ctx.input(0)?;
    let zero = scalar(ctx, x, 0.0);
    let positive = binary(ctx, BinaryOp::Greater, x, zero)?;
    let negative = exp_minus_one(ctx, x, alpha, None)?;
    let chosen = ctx.add(Op::Where, &[positive, x, negative])?;
    let g = scalar(ctx, x, gamma);
    Ok(vec![binary(ctx, BinaryOp::Mul, chosen, g)?])
}

/// `max(0, x) + min(0, α·(e^(x/α) − 1))`: `x` for `x > 0`, the exponential branch otherwise.
fn celu(ctx: &mut NodeCtx) -> Translated {
    let alpha = float(ctx, "alpha", 1.0)?;
    if alpha == 0.0 {
        return Err(ctx.error("alpha is 0 (Celu divides by it)"));
    }
    let x = ctx.input(0)?;
    let zero = scalar(ctx, x, 0.0);
    let positive = binary(ctx, BinaryOp::Greater, x, zero)?;
    let negative = exp_minus_one(ctx, x, alpha, Some(alpha))?;
    Ok(vec![ctx.add(Op::Where, &[positive, x, negative])?])
}

/// `x` for `x > α`, 0 otherwise.
fn thresholded_relu(ctx: &mut NodeCtx) -> Translated {
    let alpha = float(ctx, "alpha", 1.0)?;
    let x = ctx.input(0)?;
    let threshold = scalar(ctx, x, alpha);
    let above = binary(ctx, BinaryOp::Greater, x, threshold)?;
    let zero = scalar(ctx, x, 0.0);
    Ok(vec![ctx.add(Op::Where, &[above, x, zero])?])
}

/// `x / (1 + |x|)`.
fn softsign(ctx: &mut NodeCtx) -> Translated {
    let x = ctx.input(0)?;
    let abs = ctx.add(Op::Unary(UnaryOp::Abs), &[x])?;
    let one = scalar(ctx, x, 1.0);
    let denominator = binary(ctx, BinaryOp::Add, abs, one)?;
    Ok(vec![binary(ctx, BinaryOp::Div, x, denominator)?])
}

/// `x − bias` for `x > λ`, `x + bias` for `x < −λ`, 0 between.
fn shrink(ctx: &mut NodeCtx) -> Translated {
    let bias = float(ctx, "bias", 0.0)?;
    let lambd = float(ctx, "lambd", 0.5)?;
    let x = ctx.input(0)?;
    if !ctx.graph.node(x).ty.dtype.is_float() {
        return Err(ctx
            .error(format!("Shrink of {} is not supported (float types only)", ctx.graph.node(x).ty.dtype)));
    }
    let (upper, lower) = (scalar(ctx, x, lambd), scalar(ctx, x, -lambd));
    let b = scalar(ctx, x, bias);
    let zero = scalar(ctx, x, 0.0);
    let (minus, plus) = (binary(ctx, BinaryOp::Sub, x, b)?, binary(ctx, BinaryOp::Add, x, b)?);
    let below = binary(ctx, BinaryOp::Less, x, lower)?;
    let low = ctx.add(Op::Where, &[below, plus, zero])?;
    let above = binary(ctx, BinaryOp::Greater, x, upper)?;
    Ok(vec![ctx.add(Op::Where, &[above, minus, low])?])
}
