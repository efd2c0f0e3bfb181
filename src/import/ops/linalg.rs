//! `MatMul`, `Gemm`, `Conv`.

use super::vision::{pair, window_pads};
use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::ir::Op;

pub(super) fn register(reg: &mut Registry) {
    reg.insert("MatMul", matmul);
    reg.insert("Gemm", gemm);
    reg.insert("Conv", conv);
}

fn matmul(ctx: &mut NodeCtx) -> Translated {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    Ok(vec![ctx.add(Op::MatMul, &[a, b])?])
}

fn gemm(ctx: &mut NodeCtx) -> Translated {
    let op = Op::Gemm {
        alpha: ctx.attr_float("alpha")?.unwrap_or(1.0),
        beta: ctx.attr_float("beta")?.unwrap_or(1.0),
        trans_a: ctx.attr_int("transA")?.unwrap_or(0) != 0,
        trans_b: ctx.attr_int("transB")?.unwrap_or(0) != 0,
    };
    let mut inputs = vec![ctx.input(0)?, ctx.input(1)?];
    inputs.extend(ctx.opt_input(2));
    Ok(vec![ctx.add(op, &inputs)?])
}

fn conv(ctx: &mut NodeCtx) -> Translated {
    let (x, w) = (ctx.ty(0)?, ctx.ty(1)?);
    if x.rank() != 4 || w.rank() != 4 {
        return Err(ctx.error(format!("only 2-D convolutions are supported (X {x}, W {w})")));
    }
    let strides = pair(ctx, "strides", 1)?;
    let dilations = pair(ctx, "dilations", 1)?;
    let kernel = [w.shape[2], w.shape[3]];
    let pads = window_pads(ctx, [x.shape[2], x.shape[3]], kernel, strides, dilations)?;
    let group = ctx.attr_int("group")?.unwrap_or(1).max(1) as usize;
    let mut inputs = vec![ctx.input(0)?, ctx.input(1)?];
    inputs.extend(ctx.opt_input(2));
    Ok(vec![ctx.add(Op::Conv { strides, pads, dilations, group, channels_last: false }, &inputs)?])
}
