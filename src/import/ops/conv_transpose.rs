//! `ConvTranspose` (2-D) as a convolution: the input with `stride − 1` zeros between its
//! elements (reshapes, concatenations with an expanded zero and a slice: views and one copy),
//! convolved at stride 1 with the filters flipped and their channel axes swapped (per group;
//! folded at import for constant filters) and padded by `dilation·(k − 1)` less the transposed convolution's own pads
//! (more where `output_padding` asks; a negative padding crops the input instead).

use ndarray::{ArrayD, IxDyn};

use super::rearrange::slice_axis;
use super::vision::pair;
use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::import::ImportError;
use crate::ir::{NodeId, Op, Tensor};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("ConvTranspose", conv_transpose);
}

fn conv_transpose(ctx: &mut NodeCtx) -> Translated {
    let (x, w) = (ctx.ty(0)?, ctx.ty(1)?);
    if x.rank() != 4 || w.rank() != 4 {
        return Err(ctx.error(format!("only 2-D transposed convolutions are supported (X {x}, W {w})")));
    }
    let strides = pair(ctx, "strides", 1)?;
    let dilations = pair(ctx, "dilations", 1)?;
    let output_padding = pair(ctx, "output_padding", 0)?;
    let group = ctx.attr_int("group")?.unwrap_or(1).max(1) as usize;
    let (channels, per_group, kernel) = (w.shape[0], w.shape[1], [w.shape[2], w.shape[3]]);
    if channels != x.shape[1] || channels % group != 0 || strides.contains(&0) || dilations.contains(&0) {
        return Err(ctx.error(format!(
            "X {x} and W {w} (group {group}, strides {strides:?}, dilations {dilations:?}) do not fit"
        )));
    }
    let input = [x.shape[2], x.shape[3]];
    // The output before any padding is taken off, along each axis.
    let full: Vec<usize> = (0..2)
        .map(|i| strides[i] * (input[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1)
        .collect();
    let pads = transposed_pads(ctx, input, strides, &full)?;
    // The filters as a convolution's: [M, C / group, kh, kw], flipped in space — a reshape
    // to [group, C / group, M / group, kh, kw], the two channel axes swapped, a reshape back,
    // and a slice backwards along both spatial axes (folded at import where W is a constant).
    let (in_group, outputs) = (channels / group, per_group * group);
    let (kh, kw) = (kernel[0], kernel[1]);
    let grouped =
        ctx.add(Op::Reshape { shape: vec![group, in_group, per_group, kh, kw] }, &[ctx.input(1)?])?;
    let swapped = ctx.add(Op::Transpose { perm: vec![0, 2, 1, 3, 4] }, &[grouped])?;
    let filters = ctx.add(Op::Reshape { shape: vec![outputs, in_group, kh, kw] }, &[swapped])?;
    let flipped_shape = [outputs, in_group, kh, kw];
    let filters = slice_axis(ctx, filters, &flipped_shape, 2, kh - 1, -1, kh)?;
    let filters = slice_axis(ctx, filters, &flipped_shape, 3, kw - 1, -1, kw)?;
    // The input spread out: `stride − 1` zeros after each element but the last, along H and W.
    let mut spread = ctx.input(0)?;
    let mut shape = x.shape.clone();
    for (i, axis) in [(0, 2), (1, 3)] {
        if strides[i] > 1 {
            spread = spread_out(ctx, spread, &shape, axis, strides[i])?;
            shape[axis] = (shape[axis] - 1) * strides[i] + 1;
        }
    }
    // The convolution's padding: dilation·(k − 1) less the transposed pads, output_padding at
    // the end; what is negative crops the spread input.
    let mut conv_pads = [0usize; 4];
    let mut crop = [(0usize, 0usize); 2];
    for i in 0..2 {
        let reach = (dilations[i] * (kernel[i] - 1)) as i64;
        let begin = reach - pads[i];
        let end = reach - pads[i + 2] + output_padding[i] as i64;
        (conv_pads[i], crop[i].0) = if begin >= 0 { (begin as usize, 0) } else { (0, (-begin) as usize) };
        (conv_pads[i + 2], crop[i].1) = if end >= 0 { (end as usize, 0) } else { (0, (-end) as usize) };
    }
    for (i, &(begin, end)) in crop.iter().enumerate().filter(|(_, &(b, e))| b + e > 0) {
        let len = shape[2 + i].saturating_sub(begin + end);
        spread = slice_axis(ctx, spread, &shape, 2 + i, begin, 1, len)?;
        shape[2 + i] = len;
    }
    let mut inputs = vec![spread, filters];
    inputs.extend(ctx.opt_input(2));
    let conv = Op::Conv { strides: [1, 1], pads: conv_pads, dilations, group, channels_last: false };
    Ok(vec![ctx.add(conv, &inputs)?])
}

/// The pads (top, left, bottom, right) the transposed convolution takes off its `full`
/// output: `pads`, or what `output_shape` or `auto_pad` ask for (negative: added).
fn transposed_pads(
    ctx: &NodeCtx,
    input: [usize; 2],
    strides: [usize; 2],
    full: &[usize],
) -> Result<[i64; 4], ImportError> {
    let auto = ctx.attr_string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let wanted: Option<Vec<usize>> = match ctx.attr_ints("output_shape")? {
        Some(s) => {
            let s: Vec<i64> = s.iter().rev().take(2).rev().copied().collect();
            Some(s.iter().map(|&v| v.max(0) as usize).collect())
        }
        None if auto == "SAME_UPPER" || auto == "SAME_LOWER" => {
            Some((0..2).map(|i| input[i] * strides[i]).collect())
        }
        None => None,
    };
    let Some(wanted) = wanted else {
        return match (auto.as_str(), ctx.attr_ints("pads")?.as_deref()) {
            ("NOTSET" | "VALID", None) => Ok([0; 4]),
            ("NOTSET", Some(p)) if p.len() == 4 && p.iter().all(|&v| v >= 0) => Ok([p[0], p[1], p[2], p[3]]),
            (mode, p) => Err(ctx.error(format!("pads {p:?} with auto_pad \"{mode}\" are not supported"))),
        };
    };
    // Split as ONNX's reference does, rounding down; an output larger than the full one
    // (negative padding) extends it with what the bias alone gives.
    let mut pads = [0; 4];
    for i in 0..2 {
        let total = full[i] as i64 - wanted[i] as i64;
        let half = total.div_euclid(2);
        (pads[i], pads[i + 2]) =
            if auto == "SAME_UPPER" { (half, total - half) } else { (total - half, half) };
    }
    Ok(pads)
}

/// `x` (of `shape`) with `stride − 1` zeros after each element but the last along `axis`:
/// `[…, n, …]` as `[…, n, 1, …]`, zeros concatenated to `[…, n, stride, …]`, seen as
/// `[…, n·stride, …]` and sliced to `(n − 1)·stride + 1`.
fn spread_out(
    ctx: &mut NodeCtx,
    x: NodeId,
    shape: &[usize],
    axis: usize,
    stride: usize,
) -> Result<NodeId, ImportError> {
    let mut split = shape.to_vec();
    split.insert(axis + 1, 1);
    let column = ctx.add(Op::Reshape { shape: split.clone() }, &[x])?;
    let mut zeros_shape = split.clone();
    zeros_shape[axis + 1] = stride - 1;
    let zero = ctx.constant(Tensor::from_f64(ArrayD::zeros(IxDyn(&vec![1; split.len()])), ctx.ty(0)?.dtype));
    let zeros = ctx.add(Op::Expand { shape: zeros_shape }, &[zero])?;
    let joined = ctx.add(Op::Concat { axis: axis + 1 }, &[column, zeros])?;
    let mut wide = shape.to_vec();
    wide[axis] *= stride;
    let flat = ctx.add(Op::Reshape { shape: wide.clone() }, &[joined])?;
    slice_axis(ctx, flat, &wide, axis, 0, 1, (shape[axis] - 1) * stride + 1)
}
