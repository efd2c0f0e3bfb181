//! `ReduceMean`/`ReduceSum`/`ReduceMax`, `Softmax`, `LogSoftmax`, `LayerNormalization`,
//! `CumSum`.

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::ir::{Op, ReduceOp};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("ReduceMean", reduce);
    reg.insert("ReduceSum", reduce);
    reg.insert("ReduceMax", reduce);
    reg.insert("Softmax", softmax);
    reg.insert("LogSoftmax", softmax);
    reg.insert("LayerNormalization", layer_norm);
    reg.insert("CumSum", cumsum);
}

fn reduce(ctx: &mut NodeCtx) -> Translated {
    let (op, axes_became_input) = match ctx.op_type() {
        "ReduceMean" => (ReduceOp::Mean, 18),
        "ReduceSum" => (ReduceOp::Sum, 13),
        _ => (ReduceOp::Max, 18),
    };
    let rank = ctx.rank(0)?;
    let axes =
        if ctx.opset >= axes_became_input { ctx.opt_const_ints(1, "axes")? } else { ctx.attr_ints("axes")? };
    let axes = match axes {
        Some(axes) if !axes.is_empty() => ctx.axes(&axes, rank)?,
        _ if ctx.attr_int("noop_with_empty_axes")?.unwrap_or(0) != 0 => {
            let x = ctx.input(0)?;
            return Ok(vec![ctx.add(Op::Identity, &[x])?]);
        }
        _ => (0..rank).collect(),
    };
    let keep_dims = ctx.attr_int("keepdims")?.unwrap_or(1) != 0;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Reduce { op, axes, keep_dims }, &[x])?])
}

/// From opset 13 softmax runs along one axis; before, over the flattened `axis..` dims,
/// which is a reshape to 2-D around a last-axis softmax.
fn softmax(ctx: &mut NodeCtx) -> Translated {
    let log = ctx.op_type() == "LogSoftmax";
    let ty = ctx.ty(0)?;
    let x = ctx.input(0)?;
    let make = |axis| {
        if log {
            Op::LogSoftmax { axis }
        } else {
            Op::Softmax { axis }
        }
    };
    if ctx.opset >= 13 {
        let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(-1), ty.rank())?;
        return Ok(vec![ctx.add(make(axis), &[x])?]);
    }
    let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(1), ty.rank())?;
    if axis + 1 == ty.rank() {
        return Ok(vec![ctx.add(make(axis), &[x])?]);
    }
    let rows = ty.shape[..axis].iter().product();
    let flat = ctx.add(Op::Reshape { shape: vec![rows, ty.len() / rows.max(1)] }, &[x])?;
    let soft = ctx.add(make(1), &[flat])?;
    Ok(vec![ctx.add(Op::Reshape { shape: ty.shape.clone() }, &[soft])?])
}

/// `LayerNormalization`; its optional Mean and InvStdDev outputs (over `axis..rank`, kept as
/// size-1 dims) are built from primitives next to the fused op.
fn layer_norm(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(-1), ty.rank())?;
    let epsilon = ctx.attr_float("epsilon")?.unwrap_or(1e-5);
    let x = ctx.input(0)?;
    let mut inputs = vec![x, ctx.input(1)?];
    inputs.extend(ctx.opt_input(2));
    let mut outputs = vec![ctx.add(Op::LayerNorm { axis, epsilon }, &inputs)?];
    let wanted = |i: usize| ctx.proto.output.get(i).is_some_and(|n| !n.is_empty());
    if wanted(1) || wanted(2) {
        let names = ctx.proto.output.clone();
        let axes: Vec<usize> = (axis..ty.rank()).collect();
        let mean_op = Op::Reduce { op: ReduceOp::Mean, axes: axes.clone(), keep_dims: true };
        let mean = ctx.add_named(mean_op.clone(), &[x], &names[1])?;
        outputs.push(mean);
        if wanted(2) {
            let centered = ctx.add_named(
                Op::Binary(crate::ir::BinaryOp::Sub),
                &[x, mean],
                &format!("{}_centered", names[2]),
            )?;
            let square = ctx.add_named(
                Op::Binary(crate::ir::BinaryOp::Mul),
                &[centered, centered],
                &format!("{}_square", names[2]),
            )?;
            let var = ctx.add_named(mean_op, &[square], &format!("{}_var", names[2]))?;
            let eps = ctx.constant_named(
                crate::ir::Tensor::scalar_f32(epsilon).cast(ty.dtype),
                &format!("{}_eps", names[2]),
            );
            let shifted = ctx.add_named(
                Op::Binary(crate::ir::BinaryOp::Add),
                &[var, eps],
                &format!("{}_shifted", names[2]),
            )?;
            let std =
                ctx.add_named(Op::Unary(crate::ir::UnaryOp::Sqrt), &[shifted], &format!("{}_std", names[2]))?;
            outputs.push(ctx.add_named(Op::Unary(crate::ir::UnaryOp::Reciprocal), &[std], &names[2])?);
        }
    }
    Ok(outputs)
}

fn cumsum(ctx: &mut NodeCtx) -> Translated {
    let rank = ctx.rank(0)?;
    let axis = match ctx.const_ints(1, "axis")?.as_slice() {
        [a] => ctx.axis(*a, rank)?,
        other => return Err(ctx.error(format!("axis must hold one value, got {other:?}"))),
    };
    let exclusive = ctx.attr_int("exclusive")?.unwrap_or(0) != 0;
    let reverse = ctx.attr_int("reverse")?.unwrap_or(0) != 0;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::CumSum { axis, exclusive, reverse }, &[x])?])
}
