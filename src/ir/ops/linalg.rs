//! Matrix products: `MatMul` (numpy semantics), `Gemm`, 2-D `Conv`. The evaluator accumulates
//! in f64.

use ndarray::{Array2, ArrayD, Axis, Ix2, IxDyn};

use super::elementwise::broadcast_shapes;
use super::OpResult;
use crate::ir::dtype::TensorType;
use crate::ir::tensor::Tensor;

fn float_inputs(op: &str, inputs: &[&TensorType]) -> OpResult<()> {
    let first = inputs[0].dtype;
    if !first.is_float() {
        return Err(format!("{op} needs floating-point inputs, got {first}"));
    }
    match inputs.iter().find(|t| t.dtype != first) {
        Some(other) => Err(format!("{op} inputs differ in type: {first} and {}", other.dtype)),
        None => Ok(()),
    }
}

/// The batch shape and (m, k, n) of a numpy matmul, after 1-D promotion.
struct MatMulDims {
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    out: Vec<usize>,
}

fn matmul_dims(a: &[usize], b: &[usize]) -> OpResult<MatMulDims> {
    if a.is_empty() || b.is_empty() {
        return Err("MatMul inputs must have rank ≥ 1".into());
    }
    let a2: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(format!("MatMul inner dims differ: {a:?} · {b:?}"));
    }
    let batch = broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    let mut out = batch.clone();
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    Ok(MatMulDims { batch, m, k, n, out })
}

pub fn infer_matmul(a: &TensorType, b: &TensorType) -> OpResult<TensorType> {
    float_inputs("MatMul", &[a, b])?;
    Ok(TensorType::new(a.dtype, matmul_dims(&a.shape, &b.shape)?.out))
}

/// `a` broadcast to `batch ++ [rows, cols]`, as a list of 2-D matrices.
fn batched(a: &ArrayD<f64>, batch: &[usize], rows: usize, cols: usize) -> OpResult<Vec<Array2<f64>>> {
    let full: Vec<usize> = batch.iter().copied().chain([rows, cols]).collect();
    let a = a
        .to_shape(IxDyn(&[&a.shape()[..a.ndim().saturating_sub(2)], &[rows, cols]].concat()))
        .map_err(|e| e.to_string())?;
    let view = a.broadcast(IxDyn(&full)).ok_or("MatMul batch dims do not broadcast")?;
    let count = batch.iter().product::<usize>();
    let flat = view.to_shape(IxDyn(&[count, rows, cols])).map_err(|e| e.to_string())?;
    flat.axis_iter(Axis(0))
        .map(|m| m.into_dimensionality::<Ix2>().map(|m| m.to_owned()).map_err(|e| e.to_string()))
        .collect()
}

pub fn eval_matmul(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let out = infer_matmul(&a.tensor_type(), &b.tensor_type())?;
    let d = matmul_dims(a.shape(), b.shape())?;
    let lhs = batched(&a.to_f64(), &d.batch, d.m, d.k)?;
    let rhs = batched(&b.to_f64(), &d.batch, d.k, d.n)?;
    let mut values = Vec::with_capacity(out.len());
    for (x, y) in lhs.iter().zip(&rhs) {
        values.extend(x.dot(y).iter().copied());
    }
    let values = ArrayD::from_shape_vec(IxDyn(&out.shape), values).map_err(|e| e.to_string())?;
    Ok(Tensor::from_f64(values, out.dtype))
}

pub fn infer_gemm(inputs: &[&TensorType], trans_a: bool, trans_b: bool) -> OpResult<TensorType> {
    float_inputs("Gemm", inputs)?;
    let (a, b) = (&inputs[0].shape, &inputs[1].shape);
    if a.len() != 2 || b.len() != 2 {
        return Err(format!("Gemm needs 2-D A and B, got {a:?} and {b:?}"));
    }
    let (m, k) = if trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
    let (kb, n) = if trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
    if k != kb {
        return Err(format!("Gemm inner dims differ: A {a:?}, B {b:?}"));
    }
    if let Some(c) = inputs.get(2) {
        let shape = broadcast_shapes(&c.shape, &[m, n])?;
        if shape != [m, n] {
            return Err(format!("Gemm's C {:?} does not broadcast to [{m}, {n}]", c.shape));
        }
    }
    Ok(TensorType::new(inputs[0].dtype, vec![m, n]))
}

fn as_matrix(t: &Tensor, transpose: bool) -> OpResult<Array2<f64>> {
    let m = t.to_f64().into_dimensionality::<Ix2>().map_err(|e| e.to_string())?;
    Ok(if transpose { m.reversed_axes() } else { m })
}

pub fn eval_gemm(
    inputs: &[&Tensor],
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> OpResult<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let out = infer_gemm(&types.iter().collect::<Vec<_>>(), trans_a, trans_b)?;
    let a = as_matrix(inputs[0], trans_a)?;
    let b = as_matrix(inputs[1], trans_b)?;
    let mut y = a.dot(&b) * f64::from(alpha);
    if let Some(c) = inputs.get(2) {
        let c = c.to_f64();
        let c = c.broadcast(IxDyn(&out.shape)).ok_or("Gemm's C does not broadcast")?;
        y.zip_mut_with(&c.into_dimensionality::<Ix2>().map_err(|e| e.to_string())?, |y, c| {
            *y += f64::from(beta) * c
        });
    }
    Ok(Tensor::from_f64(y.into_dyn(), out.dtype))
}

/// Output extent of one convolution axis.
fn conv_extent(input: usize, kernel: usize, stride: usize, pad: usize, dilation: usize) -> OpResult<usize> {
    let span = dilation * (kernel - 1) + 1;
    (input + pad)
        .checked_sub(span)
        .map(|v| v / stride + 1)
        .ok_or_else(|| format!("Conv kernel span {span} is larger than the padded input {}", input + pad))
}

pub fn infer_conv(
    inputs: &[&TensorType],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
) -> OpResult<TensorType> {
    float_inputs("Conv", inputs)?;
    let (x, w) = (&inputs[0].shape, &inputs[1].shape);
    if x.len() != 4 || w.len() != 4 {
        return Err(format!("only 2-D Conv (NCHW) is supported, got X {x:?}, W {w:?}"));
    }
    if group == 0 || x[1] != w[1] * group || w[0] % group != 0 {
        return Err(format!("Conv channels do not match: X {x:?}, W {w:?}, group {group}"));
    }
    if let Some(bias) = inputs.get(2) {
        if bias.shape != [w[0]] {
            return Err(format!("Conv bias {:?} must be [{}]", bias.shape, w[0]));
        }
    }
    let h = conv_extent(x[2], w[2], strides[0], pads[0] + pads[2], dilations[0])?;
    let wd = conv_extent(x[3], w[3], strides[1], pads[1] + pads[3], dilations[1])?;
    Ok(TensorType::new(inputs[0].dtype, vec![x[0], w[0], h, wd]))
}

pub fn eval_conv(
    inputs: &[&Tensor],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
) -> OpResult<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let out = infer_conv(&types.iter().collect::<Vec<_>>(), strides, pads, dilations, group)?;
    let (x, w) = (inputs[0].to_f64(), inputs[1].to_f64());
    let bias = inputs.get(2).map(|b| b.to_f64());
    let (xs, ws, os) = (x.shape(), w.shape(), &out.shape);
    let (cin_per_group, cout_per_group) = (ws[1], ws[0] / group);
    let mut y = ArrayD::<f64>::zeros(IxDyn(os));
    for n in 0..os[0] {
        for co in 0..os[1] {
            let g = co / cout_per_group;
            let b = bias.as_ref().map_or(0.0, |b| b[[co]]);
            for oh in 0..os[2] {
                for ow in 0..os[3] {
                    let mut acc = b;
                    for ci in 0..cin_per_group {
                        let c = g * cin_per_group + ci;
                        for kh in 0..ws[2] {
                            let ih = (oh * strides[0] + kh * dilations[0]) as isize - pads[0] as isize;
                            if ih < 0 || ih as usize >= xs[2] {
                                continue;
                            }
                            for kw in 0..ws[3] {
                                let iw = (ow * strides[1] + kw * dilations[1]) as isize - pads[1] as isize;
                                if iw < 0 || iw as usize >= xs[3] {
                                    continue;
                                }
                                acc += x[[n, c, ih as usize, iw as usize]] * w[[co, ci, kh, kw]];
                            }
                        }
                    }
                    y[[n, co, oh, ow]] = acc;
                }
            }
        }
    }
    Ok(Tensor::from_f64(y, out.dtype))
}

pub fn infer_attention(inputs: &[&TensorType]) -> OpResult<TensorType> {
    float_inputs("Attention", inputs)?;
    let (q, kt, v) = (inputs[0], inputs[1], inputs[2]);
    let scores = infer_matmul(q, kt)?;
    if scores.rank() < 2 {
        return Err(format!("Attention scores {scores} must have rank ≥ 2"));
    }
    if let Some(mask) = inputs.get(3) {
        if broadcast_shapes(&mask.shape, &scores.shape)? != scores.shape {
            return Err(format!("Attention mask {mask} does not broadcast to the scores {scores}"));
        }
    }
    infer_matmul(&scores, v)
}

pub fn eval_attention(inputs: &[&Tensor], scale: f32, nan_to_zero: bool) -> OpResult<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let out = infer_attention(&types.iter().collect::<Vec<_>>())?;
    // Everything in f64, rounded once at the end.
    let (q, kt) = (Tensor::F64(inputs[0].to_f64()), Tensor::F64(inputs[1].to_f64()));
    let mut scores = eval_matmul(&q, &kt)?.to_f64() * f64::from(scale);
    if let Some(mask) = inputs.get(3) {
        let mask = mask.to_f64();
        let mask = mask.broadcast(scores.raw_dim()).ok_or("Attention mask does not broadcast")?;
        scores.zip_mut_with(&mask, |s, m| *s += m);
    }
    let last = Axis(scores.ndim() - 1);
    for mut row in scores.lanes_mut(last) {
        let max = row.fold(f64::NEG_INFINITY, |m, &e| m.max(e));
        let sum: f64 = row.iter().map(|&e| (e - max).exp()).sum();
        row.mapv_inplace(|e| {
            let p = (e - max).exp() / sum;
            if nan_to_zero && p.is_nan() {
                0.0
            } else {
                p
            }
        });
    }
    let probs = Tensor::F64(scores);
    let v = Tensor::F64(inputs[2].to_f64());
    Ok(eval_matmul(&probs, &v)?.cast(out.dtype))
}

/// NHWC to NCHW (`[0, 3, 1, 2]`), and KRSC filters to KCRS.
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];
/// NCHW to NHWC (`[0, 2, 3, 1]`), and KCRS filters to KRSC.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];

fn permuted(t: &TensorType, perm: &[usize; 4]) -> OpResult<TensorType> {
    if t.rank() != 4 {
        return Err(format!("a channels-last convolution needs rank-4 operands, got {t}"));
    }
    Ok(TensorType::new(t.dtype, perm.iter().map(|&p| t.shape[p]).collect()))
}

/// A channels-last convolution's type: the NCHW one's, permuted.
pub fn infer_conv_nhwc(
    inputs: &[&TensorType],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
) -> OpResult<TensorType> {
    let (x, w) = (permuted(inputs[0], &TO_NCHW)?, permuted(inputs[1], &TO_NCHW)?);
    let mut nchw = vec![&x, &w];
    nchw.extend(inputs.get(2).copied());
    permuted(&infer_conv(&nchw, strides, pads, dilations, group)?, &TO_NHWC)
}

/// A channels-last convolution: the NCHW one on the operands permuted, its result permuted
/// back.
pub fn eval_conv_nhwc(
    inputs: &[&Tensor],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
) -> OpResult<Tensor> {
    let x = super::layout::eval_transpose(inputs[0], &TO_NCHW)?;
    let w = super::layout::eval_transpose(inputs[1], &TO_NCHW)?;
    let mut nchw = vec![&x, &w];
    nchw.extend(inputs.get(2).copied());
    let y = eval_conv(&nchw, strides, pads, dilations, group)?;
    super::layout::eval_transpose(&y, &TO_NHWC)
}
