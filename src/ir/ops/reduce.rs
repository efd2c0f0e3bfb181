//! Reductions and the row ops built on them: `Reduce{Mean,Sum,Max}`, `Softmax`,
//! `LogSoftmax`, `LayerNorm`, `CumSum`. Sums accumulate in f64.

use ndarray::{ArrayD, Axis, IxDyn};

use super::elementwise::broadcast_shapes;
use super::OpResult;
use crate::ir::dtype::TensorType;
use crate::ir::op::ReduceOp;
use crate::ir::tensor::Tensor;

fn check_axis(axis: usize, rank: usize, op: &str) -> OpResult<()> {
    if axis >= rank {
        return Err(format!("{op} axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

pub fn infer_reduce(x: &TensorType, op: ReduceOp, axes: &[usize], keep_dims: bool) -> OpResult<TensorType> {
    if x.dtype == crate::ir::dtype::DType::Bool {
        return Err(format!("Reduce{op:?} is not defined on bool"));
    }
    for &a in axes {
        check_axis(a, x.rank(), "Reduce")?;
    }
    let shape = (0..x.rank())
        .filter_map(|i| match (axes.contains(&i), keep_dims) {
            (false, _) => Some(x.shape[i]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Ok(TensorType::new(x.dtype, shape))
}

pub fn eval_reduce(x: &Tensor, op: ReduceOp, axes: &[usize], keep_dims: bool) -> OpResult<Tensor> {
    let out = infer_reduce(&x.tensor_type(), op, axes, keep_dims)?;
    let mut v = x.to_f64();
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    for &axis in sorted.iter().rev() {
        let n = v.shape()[axis];
        v = match op {
            ReduceOp::Sum => v.sum_axis(Axis(axis)),
            ReduceOp::Mean => v.sum_axis(Axis(axis)) / n as f64,
            ReduceOp::Max => v.fold_axis(Axis(axis), f64::NEG_INFINITY, |m, &e| {
                if e.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    m.max(e)
                }
            }),
        };
    }
    let v = v.into_shape_with_order(IxDyn(&out.shape)).map_err(|e| e.to_string())?;
    Ok(Tensor::from_f64(v, out.dtype))
}

pub fn infer_softmax(x: &TensorType, axis: usize) -> OpResult<TensorType> {
    check_axis(axis, x.rank(), "Softmax")?;
    if !x.dtype.is_float() {
        return Err(format!("Softmax needs a floating-point input, got {}", x.dtype));
    }
    Ok(x.clone())
}

pub fn eval_softmax(x: &Tensor, axis: usize, log: bool) -> OpResult<Tensor> {
    infer_softmax(&x.tensor_type(), axis)?;
    let mut v = x.to_f64();
    for mut lane in v.lanes_mut(Axis(axis)) {
        let max = lane.fold(f64::NEG_INFINITY, |m, &e| m.max(e));
        let sum: f64 = lane.iter().map(|&e| (e - max).exp()).sum();
        lane.mapv_inplace(|e| if log { e - max - sum.ln() } else { (e - max).exp() / sum });
    }
    Ok(Tensor::from_f64(v, x.dtype()))
}

pub fn infer_layer_norm(inputs: &[&TensorType], axis: usize) -> OpResult<TensorType> {
    let x = inputs[0];
    check_axis(axis, x.rank(), "LayerNormalization")?;
    if !x.dtype.is_float() {
        return Err(format!("LayerNormalization needs a floating-point input, got {}", x.dtype));
    }
    let normalized = &x.shape[axis..];
    for param in &inputs[1..] {
        if param.dtype != x.dtype {
            return Err(format!(
                "LayerNormalization scale/bias type {} differs from {}",
                param.dtype, x.dtype
            ));
        }
        if broadcast_shapes(&param.shape, normalized)? != normalized {
            return Err(format!(
                "LayerNormalization scale/bias {:?} does not broadcast to {normalized:?}",
                param.shape
            ));
        }
    }
    Ok(x.clone())
}

/// Applies `normalize(row) -> (shift, inv)` to every row of `inputs[0]` over `axis..rank`
/// and writes `(v − shift) · inv · scale + bias`.
fn eval_row_norm(
    inputs: &[&Tensor],
    axis: usize,
    normalize: impl Fn(&[f64]) -> (f64, f64),
) -> OpResult<Tensor> {
    let x = inputs[0];
    let ty = x.tensor_type();
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    infer_layer_norm(&types.iter().collect::<Vec<_>>(), axis)?;
    let rows: usize = ty.shape[..axis].iter().product();
    let width: usize = ty.shape[axis..].iter().product();
    let param = |i: usize, default: f64| -> OpResult<Vec<f64>> {
        match inputs.get(i) {
            Some(p) => Ok(p
                .to_f64()
                .broadcast(IxDyn(&ty.shape[axis..]))
                .ok_or("normalization parameter does not broadcast")?
                .iter()
                .copied()
                .collect()),
            None => Ok(vec![default; width]),
        }
    };
    let (scale, bias) = (param(1, 1.0)?, param(2, 0.0)?);
    let flat: Vec<f64> = x.to_f64().iter().copied().collect();
    let mut out = Vec::with_capacity(flat.len());
    for r in 0..rows {
        let row = &flat[r * width..(r + 1) * width];
        let (shift, inv) = normalize(row);
        out.extend(row.iter().enumerate().map(|(i, v)| (v - shift) * inv * scale[i] + bias[i]));
    }
    let out = ArrayD::from_shape_vec(IxDyn(&ty.shape), out).map_err(|e| e.to_string())?;
    Ok(Tensor::from_f64(out, ty.dtype))
}

pub fn eval_layer_norm(inputs: &[&Tensor], axis: usize, epsilon: f32) -> OpResult<Tensor> {
    eval_row_norm(inputs, axis, |row| {
        let n = row.len() as f64;
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        (mean, 1.0 / (var + f64::from(epsilon)).sqrt())
    })
}

/// RMSNorm; with `deviation`, of x's deviations from its mean (x itself not centred).
pub fn eval_rms_norm(inputs: &[&Tensor], axis: usize, epsilon: f32, deviation: bool) -> OpResult<Tensor> {
    if inputs.len() > 2 {
        return Err("RmsNorm takes x and an optional scale".into());
    }
    eval_row_norm(inputs, axis, |row| {
        let n = row.len() as f64;
        let mean = if deviation { row.iter().sum::<f64>() / n } else { 0.0 };
        let mean_square = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        (0.0, 1.0 / (mean_square + f64::from(epsilon)).sqrt())
    })
}

pub fn infer_cumsum(x: &TensorType, axis: usize) -> OpResult<TensorType> {
    check_axis(axis, x.rank(), "CumSum")?;
    if x.dtype == crate::ir::dtype::DType::Bool {
        return Err("CumSum is not defined on bool".into());
    }
    Ok(x.clone())
}

pub fn eval_cumsum(x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> OpResult<Tensor> {
    infer_cumsum(&x.tensor_type(), axis)?;
    let mut v = x.to_f64();
    for mut lane in v.lanes_mut(Axis(axis)) {
        let n = lane.len();
        let mut acc = 0.0;
        for step in 0..n {
            let i = if reverse { n - 1 - step } else { step };
            let value = lane[i];
            if exclusive {
                lane[i] = acc;
                acc += value;
            } else {
                acc += value;
                lane[i] = acc;
            }
        }
    }
    Ok(Tensor::from_f64(v, x.dtype()))
}
