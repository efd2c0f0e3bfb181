//! Ops that only compute shapes or constants: `Shape`, `Size`, `ConstantOfShape`, `Range`,
//! `Constant`. Shapes are static in the IR, so each of these becomes a constant; one that
//! depends on run-time values is an error.

use ndarray::{Array1, ArrayD, IxDyn};

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::ir::{Tensor, TensorType};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("Shape", shape);
    reg.insert("Size", size);
    reg.insert("ConstantOfShape", constant_of_shape);
    reg.insert("Range", range);
    reg.insert("Constant", constant);
}

fn shape(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let rank = ty.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clamp(ctx.attr_int("start")?.unwrap_or(0));
    let end = clamp(ctx.attr_int("end")?.unwrap_or(rank));
    let dims: Vec<i64> = ty.shape[start..end.max(start)].iter().map(|&d| d as i64).collect();
    Ok(vec![ctx.constant(Tensor::from_i64_slice(&dims))])
}

fn size(ctx: &mut NodeCtx) -> Translated {
    let len = ctx.ty(0)?.len() as i64;
    Ok(vec![ctx.constant(Tensor::I64(ArrayD::from_elem(IxDyn(&[]), len)))])
}

fn constant_of_shape(ctx: &mut NodeCtx) -> Translated {
    let dims = ctx.const_ints(0, "shape")?;
    let shape = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| ctx.error(format!("shape {dims:?} has a negative entry"))))
        .collect::<Result<Vec<_>, _>>()?;
    let value = ctx.attr_tensor("value")?.unwrap_or_else(|| Tensor::scalar_f32(0.0));
    if value.len() != 1 {
        return Err(ctx.error("value must hold one element"));
    }
    let fill = value.to_f64_vec()[0];
    ctx.check_constant_size(&shape)?;
    let kept = value.dtype().is_float() || value.dtype() == crate::ir::DType::Bool;
    if kept && shape.iter().product::<usize>() >= crate::ir::UNIFORM_ELEMENTS {
        let name = ctx.output_name();
        let one =
            value.reshaped(&vec![1; shape.len()]).ok_or_else(|| ctx.error("value must hold one element"))?;
        return Ok(vec![ctx.expanded(one, &shape, &name)?]);
    }
    Ok(vec![ctx.constant(Tensor::full(&TensorType::new(value.dtype(), shape), fill))])
}

fn range(ctx: &mut NodeCtx) -> Translated {
    let start = ctx.const_input(0, "start")?;
    let limit = ctx.const_input(1, "limit")?.to_f64_vec();
    let delta = ctx.const_input(2, "delta")?.to_f64_vec();
    let dtype = start.dtype();
    let (start, limit, delta) = match (start.to_f64_vec().as_slice(), limit.as_slice(), delta.as_slice()) {
        ([s], [l], [d]) if *d != 0.0 => (*s, *l, *d),
        _ => return Err(ctx.error("start, limit and delta must be scalars with delta ≠ 0")),
    };
    let steps = ((limit - start) / delta).ceil().max(0.0);
    // Compared as a float first: a huge or infinite count saturates the conversion.
    let count = if steps.is_finite() { steps as usize } else { usize::MAX };
    ctx.check_constant_size(&[count])?;
    let values = Array1::from_iter((0..count).map(|i| start + i as f64 * delta)).into_dyn();
    let value = if dtype.is_int() {
        Tensor::from_i64(values.mapv(|v| v.round() as i64), dtype)
    } else {
        Tensor::from_f64(values, dtype)
    };
    Ok(vec![ctx.constant(value)])
}

fn constant(ctx: &mut NodeCtx) -> Translated {
    let value = if let Some(t) = ctx.attr_tensor("value")? {
        t
    } else if let Some(v) = ctx.attr_float("value_float")? {
        Tensor::scalar_f32(v)
    } else if let Some(v) = ctx.attr_floats("value_floats")? {
        Tensor::F32(Array1::from(v).into_dyn())
    } else if let Some(v) = ctx.attr_int("value_int")? {
        Tensor::I64(ArrayD::from_elem(IxDyn(&[]), v))
    } else if let Some(v) = ctx.attr_ints("value_ints")? {
        Tensor::from_i64_slice(&v)
    } else {
        return Err(ctx.error("only value, value_float(s) and value_int(s) constants are supported"));
    };
    Ok(vec![ctx.constant(value)])
}
