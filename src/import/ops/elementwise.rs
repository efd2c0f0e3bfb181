//! Pointwise ops: unary math, binary arithmetic and comparisons, `Min`/`Max`, `Where`,
//! `Cast`, `Clip`, `Gelu`, `Identity`, `Dropout`.

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::ir::{BinaryOp, DType, Op, UnaryOp};

pub(super) fn register(reg: &mut Registry) {
    for name in [
        "Neg",
        "Abs",
        "Sqrt",
        "Reciprocal",
        "Exp",
        "Log",
        "Erf",
        "Tanh",
        "Sigmoid",
        "Relu",
        "Sin",
        "Cos",
        "Not",
        "IsNaN",
    ] {
        reg.insert(name, unary);
    }
    for name in [
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Mod",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "And",
    ] {
        reg.insert(name, binary);
    }
    reg.insert("Min", variadic);
    reg.insert("Max", variadic);
    reg.insert("Gelu", gelu);
    reg.insert("Where", where_);
    reg.insert("Cast", cast);
    reg.insert("Clip", clip);
    reg.insert("Identity", identity);
    reg.insert("Dropout", dropout);
}

fn unary_op(op_type: &str) -> Option<UnaryOp> {
    Some(match op_type {
        "Neg" => UnaryOp::Neg,
        "Abs" => UnaryOp::Abs,
        "Sqrt" => UnaryOp::Sqrt,
        "Reciprocal" => UnaryOp::Reciprocal,
        "Exp" => UnaryOp::Exp,
        "Log" => UnaryOp::Log,
        "Erf" => UnaryOp::Erf,
        "Tanh" => UnaryOp::Tanh,
        "Sigmoid" => UnaryOp::Sigmoid,
        "Relu" => UnaryOp::Relu,
        "Sin" => UnaryOp::Sin,
        "Cos" => UnaryOp::Cos,
        "Not" => UnaryOp::Not,
        "IsNaN" => UnaryOp::IsNaN,
        _ => return None,
    })
}

fn binary_op(op_type: &str) -> Option<BinaryOp> {
    Some(match op_type {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Pow" => BinaryOp::Pow,
        "Mod" => BinaryOp::Mod,
        "Min" => BinaryOp::Min,
        "Max" => BinaryOp::Max,
        "Equal" => BinaryOp::Equal,
        "Less" => BinaryOp::Less,
        "LessOrEqual" => BinaryOp::LessOrEqual,
        "Greater" => BinaryOp::Greater,
        "GreaterOrEqual" => BinaryOp::GreaterOrEqual,
        "And" => BinaryOp::And,
        _ => return None,
    })
}

fn unary(ctx: &mut NodeCtx) -> Translated {
    let op = unary_op(ctx.op_type()).ok_or_else(|| ctx.error("not a unary op"))?;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Unary(op), &[x])?])
}

fn binary(ctx: &mut NodeCtx) -> Translated {
    let mut op = binary_op(ctx.op_type()).ok_or_else(|| ctx.error("not a binary op"))?;
    if op == BinaryOp::Mod && ctx.attr_int("fmod")?.unwrap_or(0) != 0 {
        op = BinaryOp::Fmod;
    }
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    Ok(vec![ctx.add(Op::Binary(op), &[a, b])?])
}

/// `Min`/`Max` of any number of inputs, as a left fold of binary ops.
fn variadic(ctx: &mut NodeCtx) -> Translated {
    let op = binary_op(ctx.op_type()).ok_or_else(|| ctx.error("not a variadic op"))?;
    let mut acc = ctx.input(0)?;
    if ctx.inputs.len() == 1 {
        return Ok(vec![ctx.add(Op::Identity, &[acc])?]);
    }
    for i in 1..ctx.inputs.len() {
        let next = ctx.input(i)?;
        acc = ctx.add(Op::Binary(op), &[acc, next])?;
    }
    Ok(vec![acc])
}

fn gelu(ctx: &mut NodeCtx) -> Translated {
    let op = match ctx.attr_string("approximate")?.as_deref() {
        None | Some("none") => UnaryOp::Gelu,
        Some("tanh") => UnaryOp::GeluTanh,
        Some(other) => return Err(ctx.error(format!("unknown approximate=\"{other}\""))),
    };
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Unary(op), &[x])?])
}

fn where_(ctx: &mut NodeCtx) -> Translated {
    let (c, x, y) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    Ok(vec![ctx.add(Op::Where, &[c, x, y])?])
}

fn cast(ctx: &mut NodeCtx) -> Translated {
    let code = ctx.attr_int("to")?.ok_or_else(|| ctx.error("attribute 'to' is required"))?;
    let to = DType::from_onnx_code(code)
        .ok_or_else(|| ctx.error(format!("cast to ONNX element type {code} is not supported")))?;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Cast { to }, &[x])?])
}

fn clip(ctx: &mut NodeCtx) -> Translated {
    let bound = |ctx: &NodeCtx, i: usize, attr: &str, default: f64| -> Result<f64, _> {
        if ctx.opset < 11 {
            return Ok(ctx.attr_float(attr)?.map_or(default, f64::from));
        }
        match ctx.opt_input(i) {
            Some(_) => ctx
                .const_input(i, attr)?
                .to_f64_vec()
                .first()
                .copied()
                .ok_or_else(|| ctx.error(format!("{attr} is empty"))),
            None => Ok(default),
        }
    };
    let min = bound(ctx, 1, "min", f64::NEG_INFINITY)?;
    let max = bound(ctx, 2, "max", f64::INFINITY)?;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Clip { min, max }, &[x])?])
}

fn identity(ctx: &mut NodeCtx) -> Translated {
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Identity, &[x])?])
}

/// Inference dropout is the identity. A model that asks for training mode, or reads the mask,
/// would need random numbers at run time: that is refused, not silently changed.
fn dropout(ctx: &mut NodeCtx) -> Translated {
    if ctx.opt_input(2).is_some() {
        let training = ctx.const_input(2, "training_mode")?;
        if training.to_i64_vec().iter().any(|&t| t != 0) {
            return Err(
                ctx.error("training_mode is true: only inference Dropout (the identity) is supported")
            );
        }
    }
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Dropout, &[x])?])
}
