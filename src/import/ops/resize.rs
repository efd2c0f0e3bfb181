//! `Resize` and `Upsample` as index maps: along each resized axis, every output position reads
//! one input position (`nearest`), or a weighted sum of two (`linear`) or four (`cubic`), with
//! the positions and weights computed here, at import, from the sizes, the scales and the
//! coordinate transformation mode. Each axis becomes `Gather`s of constant indices and, for the
//! interpolating modes, products with constant weights and a sum, which fusion puts in one
//! kernel with the neighbours; a nearest upsampling by a whole factor becomes views (a new
//! axis broadcast and merged) that the consumers read through. N-linear and N-cubic
//! interpolation are separable: one axis after the other gives the same values.

use ndarray::{ArrayD, IxDyn};

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::import::ImportError;
use crate::ir::{BinaryOp, DType, NodeId, Op, Tensor};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("Resize", resize);
    reg.insert("Upsample", resize);
}

/// How an output coordinate maps back to the input.
#[derive(Clone, Copy, PartialEq)]
enum Transform {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest(Rounding),
    Linear,
    Cubic { a: f64, exclude_outside: bool },
}

/// How `nearest` rounds a fractional input coordinate.
#[derive(Clone, Copy, PartialEq)]
enum Rounding {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

fn resize(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let rank = ty.rank();
    let legacy = ctx.op_type() == "Upsample" || ctx.opset < 11;
    let mode_name = ctx.attr_string("mode")?.unwrap_or_else(|| "nearest".into());
    let transform = if legacy {
        Transform::Asymmetric
    } else {
        match ctx.attr_string("coordinate_transformation_mode")?.as_deref().unwrap_or("half_pixel") {
            "half_pixel" => Transform::HalfPixel,
            "half_pixel_symmetric" => Transform::HalfPixelSymmetric,
            "pytorch_half_pixel" => Transform::PytorchHalfPixel,
            "align_corners" => Transform::AlignCorners,
            "asymmetric" => Transform::Asymmetric,
            other => {
                return Err(ctx.error(format!("coordinate_transformation_mode \"{other}\" is not supported")))
            }
        }
    };
    let mode = match mode_name.as_str() {
        "nearest" if legacy => Mode::Nearest(Rounding::Floor),
        "nearest" => {
            Mode::Nearest(match ctx.attr_string("nearest_mode")?.as_deref().unwrap_or("round_prefer_floor") {
                "round_prefer_floor" => Rounding::PreferFloor,
                "round_prefer_ceil" => Rounding::PreferCeil,
                "floor" => Rounding::Floor,
                "ceil" => Rounding::Ceil,
                other => return Err(ctx.error(format!("nearest_mode \"{other}\" is not supported"))),
            })
        }
        "linear" | "bilinear" | "trilinear" => Mode::Linear,
        "cubic" if !legacy => Mode::Cubic {
            a: f64::from(ctx.attr_float("cubic_coeff_a")?.unwrap_or(-0.75)),
            exclude_outside: ctx.attr_int("exclude_outside")?.unwrap_or(0) != 0,
        },
        other => return Err(ctx.error(format!("mode \"{other}\" is not supported (nearest, linear, cubic)"))),
    };
    if !matches!(mode, Mode::Nearest(_)) && !ty.dtype.is_float() {
        return Err(ctx.error(format!("{mode_name} interpolation of {} values", ty.dtype)));
    }
    if ctx.attr_int("antialias")?.unwrap_or(0) != 0 {
        return Err(ctx.error("antialias is not supported"));
    }
    let policy = ctx.attr_string("keep_aspect_ratio_policy")?.unwrap_or_else(|| "stretch".into());
    let axes: Vec<usize> = match ctx.attr_ints("axes")? {
        Some(a) => ctx.axes(&a, rank)?,
        None => (0..rank).collect(),
    };
    // Scales and sizes: an attribute (Upsample-7), input 1 (Upsample-9, Resize-10), inputs 2
    // and 3 (Resize-11 on; roi, input 1, only matters to tf_crop_and_resize).
    let scales: Option<Vec<f64>> = if ctx.op_type() == "Upsample" && ctx.opset < 9 {
        ctx.attr_floats("scales")?.map(|s| s.iter().map(|&v| f64::from(v)).collect())
    } else {
        let k = if legacy { 1 } else { 2 };
        match ctx.opt_input(k) {
            Some(_) => Some(ctx.const_input(k, "scales")?.to_f64_vec()).filter(|s| !s.is_empty()),
            None => None,
        }
    };
    let sizes = if legacy { None } else { ctx.opt_const_ints(3, "sizes")?.filter(|s| !s.is_empty()) };
    let per_axis: Vec<(usize, usize, f64)> = match (scales, sizes) {
        (Some(scales), None) if scales.len() == axes.len() => axes
            .iter()
            .zip(&scales)
            .map(|(&axis, &scale)| (axis, (ty.shape[axis] as f64 * scale).floor() as usize, scale))
            .collect(),
        (None, Some(sizes)) if sizes.len() == axes.len() && policy == "stretch" => axes
            .iter()
            .zip(&sizes)
            .map(|(&axis, &size)| {
                let size = size.max(0) as usize;
                (axis, size, size as f64 / ty.shape[axis].max(1) as f64)
            })
            .collect(),
        // One scale for every axis, the sizes as a bound: the largest that fits in them
        // (`not_larger`) or the smallest that covers them (`not_smaller`); sizes rounded half up.
        (None, Some(sizes))
            if sizes.len() == axes.len() && (policy == "not_larger" || policy == "not_smaller") =>
        {
            let ratios = axes.iter().zip(&sizes).map(|(&a, &s)| s.max(0) as f64 / ty.shape[a].max(1) as f64);
            let scale = if policy == "not_larger" {
                ratios.fold(f64::INFINITY, f64::min)
            } else {
                ratios.fold(0.0, f64::max)
            };
            axes.iter().map(|&a| (a, (scale * ty.shape[a] as f64 + 0.5).floor() as usize, scale)).collect()
        }
        (None, Some(_)) if policy != "stretch" => {
            return Err(ctx.error(format!("keep_aspect_ratio_policy \"{policy}\" is not supported")))
        }
        _ => return Err(ctx.error(format!("give scales or sizes, one for each of the axes {axes:?}"))),
    };
    let mut current = ctx.input(0)?;
    let mut shape = ty.shape.clone();
    for (axis, out, scale) in per_axis {
        let n = shape[axis];
        if out == 0 || n == 0 || scale <= 0.0 {
            return Err(ctx.error(format!("axis {axis}: resizing {n} elements to {out} (scale {scale})")));
        }
        let taps = axis_taps(transform, mode, n, out, scale);
        if taps.iter().all(|(i, w)| i.len() == 1 && w[0] == 1.0)
            && out == n
            && taps.iter().enumerate().all(|(o, (i, _))| i[0] == o)
        {
            continue;
        }
        current = resample(ctx, current, &shape, axis, &taps, ty.dtype)?;
        shape[axis] = out;
    }
    if current == ctx.input(0)? {
        current = ctx.add(Op::Identity, &[current])?;
    }
    Ok(vec![current])
}

/// The input coordinate output position `x` maps to.
fn source(transform: Transform, x: usize, n: usize, out: usize, scale: f64) -> f64 {
    let x = x as f64;
    match transform {
        Transform::HalfPixel => (x + 0.5) / scale - 0.5,
        Transform::HalfPixelSymmetric => {
            let adjustment = out as f64 / (scale * n as f64);
            let center = n as f64 / 2.0;
            center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5
        }
        Transform::PytorchHalfPixel if out > 1 => (x + 0.5) / scale - 0.5,
        Transform::PytorchHalfPixel => 0.0,
        // The resized length as the scale gives it, before rounding down (ONNX's definition).
        Transform::AlignCorners if out > 1 => x * (n as f64 - 1.0) / (n as f64 * scale - 1.0),
        Transform::AlignCorners => 0.0,
        Transform::Asymmetric => x / scale,
    }
}

/// For each output position, the input positions it reads and their weights.
fn axis_taps(
    transform: Transform,
    mode: Mode,
    n: usize,
    out: usize,
    scale: f64,
) -> Vec<(Vec<usize>, Vec<f64>)> {
    let last = n as i64 - 1;
    let clamp = |i: i64| i.clamp(0, last) as usize;
    (0..out)
        .map(|o| {
            let x = source(transform, o, n, out, scale);
            match mode {
                Mode::Nearest(rounding) => {
                    let i = match rounding {
                        Rounding::PreferFloor if x - x.floor() == 0.5 => x.floor(),
                        Rounding::PreferCeil if x - x.floor() == 0.5 => x.ceil(),
                        Rounding::PreferFloor | Rounding::PreferCeil => x.round(),
                        Rounding::Floor => x.floor(),
                        Rounding::Ceil => x.ceil(),
                    };
                    (vec![clamp(i as i64)], vec![1.0])
                }
                Mode::Linear => {
                    // Positions outside the input read its edge.
                    let x = x.clamp(0.0, last as f64);
                    let i = x.floor();
                    let t = x - i;
                    (vec![clamp(i as i64), clamp(i as i64 + 1)], vec![1.0 - t, t])
                }
                Mode::Cubic { a, exclude_outside } => {
                    let i = x.floor();
                    let t = x - i;
                    let far = |d: f64| ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a;
                    let near = |d: f64| ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0;
                    let mut w = vec![far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)];
                    let at: Vec<i64> = (-1..=2).map(|d| i as i64 + d).collect();
                    if exclude_outside {
                        for (w, &p) in w.iter_mut().zip(&at) {
                            if p < 0 || p > last {
                                *w = 0.0;
                            }
                        }
                        let sum: f64 = w.iter().sum();
                        w.iter_mut().for_each(|w| *w /= sum);
                    }
                    (at.into_iter().map(clamp).collect(), w)
                }
            }
        })
        .collect()
}

/// `x` (of `shape`) resampled along `axis` by `taps`: tap `k` of every output position is one
/// `Gather`, weighted (a constant along the axis) and summed with the others.
fn resample(
    ctx: &mut NodeCtx,
    x: NodeId,
    shape: &[usize],
    axis: usize,
    taps: &[(Vec<usize>, Vec<f64>)],
    dtype: DType,
) -> Result<NodeId, ImportError> {
    let out = taps.len();
    let count = taps[0].0.len();
    // Nearest by a whole factor `s` (each input position read by `s` outputs in a row: the 2×
    // and 4× upsampling of detectors and segmenters): views — a new axis of one after `axis`,
    // broadcast to `s`, merged into it — that the consumers read through; no kernel.
    let n = shape[axis];
    if count == 1 && n > 0 && out > n && out % n == 0 {
        let s = out / n;
        if taps.iter().enumerate().all(|(i, (at, _))| at[0] == i / s) {
            let mut split = shape.to_vec();
            split.insert(axis + 1, 1);
            let mut wide = split.clone();
            wide[axis + 1] = s;
            let mut merged = shape.to_vec();
            merged[axis] = out;
            let column = ctx.add(Op::Reshape { shape: split }, &[x])?;
            let repeated = ctx.add(Op::Expand { shape: wide }, &[column])?;
            return ctx.add(Op::Reshape { shape: merged }, &[repeated]);
        }
    }
    // The weights broadcast along the axis: [out, 1, …] over the axes after it.
    let mut weight_shape = vec![out];
    weight_shape.extend(std::iter::repeat_n(1, shape.len() - axis - 1));
    let mut sum: Option<NodeId> = None;
    for k in 0..count {
        let indices: Vec<i64> = taps.iter().map(|(i, _)| i[k] as i64).collect();
        let index = ctx.constant(Tensor::from_i64(
            ArrayD::from_shape_vec(IxDyn(&[out]), indices).map_err(|e| ctx.error(e.to_string()))?,
            DType::I64,
        ));
        let gathered = ctx.add(Op::Gather { axis }, &[x, index])?;
        if count == 1 {
            return Ok(gathered);
        }
        let weights: Vec<f64> = taps.iter().map(|(_, w)| w[k]).collect();
        let weights =
            ArrayD::from_shape_vec(IxDyn(&weight_shape), weights).map_err(|e| ctx.error(e.to_string()))?;
        let weight = ctx.constant(Tensor::from_f64(weights, dtype));
        let term = ctx.add(Op::Binary(BinaryOp::Mul), &[gathered, weight])?;
        sum = Some(match sum {
            Some(s) => ctx.add(Op::Binary(BinaryOp::Add), &[s, term])?,
            None => term,
        });
    }
    sum.ok_or_else(|| ctx.error("no taps"))
}
