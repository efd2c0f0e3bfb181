//! `MatMul`, `Gemm`, `Conv`.

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

fn pair(ctx: &NodeCtx, name: &str, default: usize) -> Result<[usize; 2], crate::import::ImportError> {
    match ctx.attr_ints(name)?.as_deref() {
        None => Ok([default; 2]),
        Some([a, b]) if *a >= 0 && *b >= 0 => Ok([*a as usize, *b as usize]),
        Some(other) => Err(ctx.error(format!("{name} {other:?}: only 2-D convolutions are supported"))),
    }
}

fn conv(ctx: &mut NodeCtx) -> Translated {
    let (x, w) = (ctx.ty(0)?, ctx.ty(1)?);
    if x.rank() != 4 || w.rank() != 4 {
        return Err(ctx.error(format!("only 2-D convolutions are supported (X {x}, W {w})")));
    }
    let strides = pair(ctx, "strides", 1)?;
    let dilations = pair(ctx, "dilations", 1)?;
    let kernel = [w.shape[2], w.shape[3]];
    let pads = match ctx.attr_string("auto_pad")?.as_deref() {
        None | Some("NOTSET") => match ctx.attr_ints("pads")?.as_deref() {
            None => [0; 4],
            Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => {
                [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
            }
            Some(p) => return Err(ctx.error(format!("pads {p:?} are not four non-negative values"))),
        },
        Some("VALID") => [0; 4],
        Some(mode @ ("SAME_UPPER" | "SAME_LOWER")) => {
            let mut pads = [0; 4];
            for i in 0..2 {
                let input = x.shape[2 + i];
                let out = input.div_ceil(strides[i]);
                let span = dilations[i] * (kernel[i] - 1) + 1;
                let total = ((out - 1) * strides[i] + span).saturating_sub(input);
                let (small, large) = (total / 2, total - total / 2);
                (pads[i], pads[i + 2]) = if mode == "SAME_UPPER" { (small, large) } else { (large, small) };
            }
            pads
        }
        Some(other) => return Err(ctx.error(format!("unknown auto_pad \"{other}\""))),
    };
    let group = ctx.attr_int("group")?.unwrap_or(1).max(1) as usize;
    let mut inputs = vec![ctx.input(0)?, ctx.input(1)?];
    inputs.extend(ctx.opt_input(2));
    Ok(vec![ctx.add(Op::Conv { strides, pads, dilations, group }, &inputs)?])
}
