//! Ops of image and normalisation models written in other ops: `DepthToSpace` and
//! `SpaceToDepth` (a reshape, a transpose, a reshape), `Pad` (concatenated constant blocks,
//! or slices of the input itself: reversed for `reflect`, its first or last element expanded
//! for `edge`, its other end for `wrap`; negative pads slice), `InstanceNormalization` and `GroupNormalization` (a LayerNorm over the
//! normalised axes, then the per-channel scale and bias), `LpNormalization`, and the
//! `ReduceL1`, `ReduceL2`, `ReduceSumSquare` reductions.

use ndarray::{ArrayD, IxDyn};

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::import::ImportError;
use crate::ir::{BinaryOp, NodeId, Op, ReduceOp, SliceAxis, Tensor, UnaryOp};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("DepthToSpace", depth_to_space);
    reg.insert("SpaceToDepth", space_to_depth);
    reg.insert("Pad", pad);
    reg.insert("InstanceNormalization", instance_norm);
    reg.insert("GroupNormalization", group_norm);
    reg.insert("LpNormalization", lp_norm);
    reg.insert("ReduceL1", reduce_norm);
    reg.insert("ReduceL2", reduce_norm);
    reg.insert("ReduceSumSquare", reduce_norm);
}

fn four_d(ctx: &NodeCtx) -> Result<[usize; 4], ImportError> {
    let ty = ctx.ty(0)?;
    ty.shape
        .as_slice()
        .try_into()
        .map_err(|_| ctx.error(format!("{} needs an NCHW input, not {ty}", ctx.op_type())))
}

fn block_size(ctx: &NodeCtx) -> Result<usize, ImportError> {
    match ctx.attr_int("blocksize")? {
        Some(b) if b > 0 => Ok(b as usize),
        other => Err(ctx.error(format!("blocksize {other:?} is not a positive number"))),
    }
}

/// `reshape → transpose → reshape` of input 0.
fn rearranged(ctx: &mut NodeCtx, split: Vec<usize>, perm: Vec<usize>, out: Vec<usize>) -> Translated {
    let x = ctx.input(0)?;
    let split = ctx.add(Op::Reshape { shape: split }, &[x])?;
    let moved = ctx.add(Op::Transpose { perm }, &[split])?;
    Ok(vec![ctx.add(Op::Reshape { shape: out }, &[moved])?])
}

fn depth_to_space(ctx: &mut NodeCtx) -> Translated {
    let [n, c, h, w] = four_d(ctx)?;
    let b = block_size(ctx)?;
    if c % (b * b) != 0 {
        return Err(ctx.error(format!("{c} channels do not split into blocks of {b}×{b}")));
    }
    let out = vec![n, c / (b * b), h * b, w * b];
    match ctx.attr_string("mode")?.as_deref() {
        None | Some("DCR") => rearranged(ctx, vec![n, b, b, c / (b * b), h, w], vec![0, 3, 4, 1, 5, 2], out),
        Some("CRD") => rearranged(ctx, vec![n, c / (b * b), b, b, h, w], vec![0, 1, 4, 2, 5, 3], out),
        Some(other) => Err(ctx.error(format!("unknown mode \"{other}\""))),
    }
}

fn space_to_depth(ctx: &mut NodeCtx) -> Translated {
    let [n, c, h, w] = four_d(ctx)?;
    let b = block_size(ctx)?;
    if h % b != 0 || w % b != 0 {
        return Err(ctx.error(format!("{h}×{w} does not split into blocks of {b}×{b}")));
    }
    let split = vec![n, c, h / b, b, w / b, b];
    let out = vec![n, c * b * b, h / b, w / b];
    match ctx.attr_string("mode")?.as_deref() {
        None | Some("DCR") => rearranged(ctx, split, vec![0, 3, 5, 1, 2, 4], out),
        Some("CRD") => rearranged(ctx, split, vec![0, 1, 3, 5, 2, 4], out),
        Some(other) => Err(ctx.error(format!("unknown mode \"{other}\""))),
    }
}

/// Constant padding: along each axis with padding, constant blocks concatenated before and
/// after. Other modes, and negative pads, are refused.
fn pad(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let rank = ty.rank();
    let mode = ctx.attr_string("mode")?.unwrap_or_else(|| "constant".into());
    if !["constant", "reflect", "edge", "wrap"].contains(&mode.as_str()) {
        return Err(
            ctx.error(format!("mode \"{mode}\" is not a padding mode (constant, reflect, edge, wrap)"))
        );
    }
    let (pads, value) = if ctx.opset < 11 {
        let pads = ctx.attr_ints("pads")?.ok_or_else(|| ctx.error("attribute 'pads' is required"))?;
        (pads, f64::from(ctx.attr_float("value")?.unwrap_or(0.0)))
    } else {
        let pads = ctx.const_ints(1, "pads")?;
        let value = match ctx.opt_input(2) {
            Some(_) if mode == "constant" => {
                ctx.const_input(2, "constant_value")?.to_f64_vec().first().copied().unwrap_or(0.0)
            }
            _ => 0.0,
        };
        (pads, value)
    };
    let axes: Vec<usize> = match ctx.opt_input(3) {
        Some(_) => ctx.axes(&ctx.const_ints(3, "axes")?, rank)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(ctx.error(format!("pads {pads:?}: two per axis of {axes:?}")));
    }
    let mut current = ctx.input(0)?;
    let mut shape = ty.shape.clone();
    for (k, &axis) in axes.iter().enumerate() {
        let (before, after) = (pads[k], pads[k + axes.len()]);
        // Negative pads crop first.
        let n = shape[axis] as i64;
        let (crop_before, crop_after) = ((-before).max(0), (-after).max(0));
        if crop_before + crop_after > n {
            return Err(ctx.error(format!("pads {pads:?} crop more than axis {axis}'s {n} elements")));
        }
        if crop_before + crop_after > 0 {
            let len = (n - crop_before - crop_after) as usize;
            current = slice_axis(ctx, current, &shape, axis, crop_before as usize, 1, len)?;
            shape[axis] = len;
        }
        let (before, after) = (before.max(0) as usize, after.max(0) as usize);
        if before == 0 && after == 0 {
            continue;
        }
        let n = shape[axis];
        let fits = match mode.as_str() {
            "reflect" => before < n && after < n,
            "edge" | "wrap" => n > 0 && (mode == "edge" || (before <= n && after <= n)),
            _ => true,
        };
        if !fits {
            return Err(ctx.error(format!(
                "{mode} padding of {before} and {after} along axis {axis} of {n} elements is not supported"
            )));
        }
        let mut block = shape.clone();
        let mut part = |ctx: &mut NodeCtx, count: usize, first: bool| -> Result<NodeId, ImportError> {
            block[axis] = count;
            match mode.as_str() {
                // x[count], …, x[1] before; x[n−2], …, x[n−1−count] after.
                "reflect" if first => slice_axis(ctx, current, &shape, axis, count, -1, count),
                "reflect" => slice_axis(ctx, current, &shape, axis, n - 2, -1, count),
                "edge" => {
                    let one = slice_axis(ctx, current, &shape, axis, if first { 0 } else { n - 1 }, 1, 1)?;
                    ctx.add(Op::Expand { shape: block.clone() }, &[one])
                }
                "wrap" if first => slice_axis(ctx, current, &shape, axis, n - count, 1, count),
                "wrap" => slice_axis(ctx, current, &shape, axis, 0, 1, count),
                _ => {
                    ctx.check_constant_size(&block)?;
                    let fill = Tensor::from_f64(ArrayD::from_elem(IxDyn(&block), value), ty.dtype);
                    Ok(ctx.constant(fill))
                }
            }
        };
        let mut inputs = Vec::with_capacity(3);
        if before > 0 {
            inputs.push(part(ctx, before, true)?);
        }
        inputs.push(current);
        if after > 0 {
            inputs.push(part(ctx, after, false)?);
        }
        current = ctx.add(Op::Concat { axis }, &inputs)?;
        shape[axis] += before + after;
    }
    if current == ctx.input(0)? {
        current = ctx.add(Op::Identity, &[current])?;
    }
    Ok(vec![current])
}

/// `len` elements of `x` (of `shape`) along `axis` from `start`, `step` apart; the other axes
/// whole.
pub(super) fn slice_axis(
    ctx: &mut NodeCtx,
    x: NodeId,
    shape: &[usize],
    axis: usize,
    start: usize,
    step: i64,
    len: usize,
) -> Result<NodeId, ImportError> {
    let axes =
        shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if i == axis {
                    SliceAxis { start, step, len }
                } else {
                    SliceAxis { start: 0, step: 1, len: d }
                }
            })
            .collect();
    ctx.add(Op::Slice { axes }, &[x])
}

/// `y · scale + bias` with `scale` and `bias` of shape `[C]` against `y`'s `[N, C, …]`.
fn channel_affine(
    ctx: &mut NodeCtx,
    y: NodeId,
    rank: usize,
    scale: NodeId,
    bias: NodeId,
) -> Result<NodeId, ImportError> {
    let channels = ctx.graph.node(scale).ty.len();
    let mut shape = vec![channels];
    shape.resize(rank - 1, 1);
    let s = ctx.add(Op::Reshape { shape: shape.clone() }, &[scale])?;
    let b = ctx.add(Op::Reshape { shape }, &[bias])?;
    let scaled = ctx.add(Op::Binary(BinaryOp::Mul), &[y, s])?;
    ctx.add(Op::Binary(BinaryOp::Add), &[scaled, b])
}

fn instance_norm(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    if ty.rank() < 3 {
        return Err(ctx.error(format!("InstanceNormalization needs an input of rank 3 or more, not {ty}")));
    }
    let epsilon = ctx.attr_float("epsilon")?.unwrap_or(1e-5);
    let (x, scale, bias) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let normed = ctx.add(Op::LayerNorm { axis: 2, epsilon }, &[x])?;
    Ok(vec![channel_affine(ctx, normed, ty.rank(), scale, bias)?])
}

/// The channels split into `num_groups` groups, each normalised over its channels and the
/// spatial axes; then the scale and bias, per channel (per group before opset 21).
fn group_norm(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let groups =
        ctx.attr_int("num_groups")?.filter(|&g| g > 0).ok_or_else(|| ctx.error("num_groups is required"))?
            as usize;
    if ty.rank() < 3 || ty.shape[1] % groups != 0 {
        return Err(ctx.error(format!("{ty} does not split into {groups} groups of channels")));
    }
    let epsilon = ctx.attr_float("epsilon")?.unwrap_or(1e-5);
    let (x, scale, bias) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let n = ty.shape[0];
    let rest = ty.len() / (n * groups).max(1);
    let grouped = ctx.add(Op::Reshape { shape: vec![n, groups, rest] }, &[x])?;
    let normed = ctx.add(Op::LayerNorm { axis: 2, epsilon }, &[grouped])?;
    if ctx.graph.node(scale).ty.len() == groups && groups != ty.shape[1] {
        let per_group = channel_affine(ctx, normed, 3, scale, bias)?;
        return Ok(vec![ctx.add(Op::Reshape { shape: ty.shape.clone() }, &[per_group])?]);
    }
    let back = ctx.add(Op::Reshape { shape: ty.shape.clone() }, &[normed])?;
    Ok(vec![channel_affine(ctx, back, ty.rank(), scale, bias)?])
}

fn lp_norm(ctx: &mut NodeCtx) -> Translated {
    let rank = ctx.rank(0)?;
    let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(-1), rank)?;
    let p = ctx.attr_int("p")?.unwrap_or(2);
    let x = ctx.input(0)?;
    let norm = match p {
        1 => {
            let abs = ctx.add(Op::Unary(UnaryOp::Abs), &[x])?;
            ctx.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![axis], keep_dims: true }, &[abs])?
        }
        2 => {
            let square = ctx.add(Op::Binary(BinaryOp::Mul), &[x, x])?;
            let sum =
                ctx.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![axis], keep_dims: true }, &[square])?;
            ctx.add(Op::Unary(UnaryOp::Sqrt), &[sum])?
        }
        other => return Err(ctx.error(format!("p = {other}: only p = 1 and p = 2 are defined"))),
    };
    // A zero vector stays zero (not 0/0).
    let quotient = ctx.add(Op::Binary(BinaryOp::Div), &[x, norm])?;
    let zero = super::vision::scalar(ctx, x, 0.0);
    let empty = ctx.add(Op::Binary(BinaryOp::Equal), &[norm, zero])?;
    Ok(vec![ctx.add(Op::Where, &[empty, zero, quotient])?])
}

/// `ReduceL1` (sum of |x|), `ReduceL2` (√ of the sum of x²), `ReduceSumSquare` (sum of x²).
fn reduce_norm(ctx: &mut NodeCtx) -> Translated {
    let rank = ctx.rank(0)?;
    let axes = if ctx.opset >= 18 { ctx.opt_const_ints(1, "axes")? } else { ctx.attr_ints("axes")? };
    let axes = match axes {
        Some(axes) if !axes.is_empty() => ctx.axes(&axes, rank)?,
        _ if ctx.attr_int("noop_with_empty_axes")?.unwrap_or(0) != 0 => {
            return Err(ctx.error("noop_with_empty_axes with no axes is not supported"));
        }
        _ => (0..rank).collect(),
    };
    let keep_dims = ctx.attr_int("keepdims")?.unwrap_or(1) != 0;
    let x = ctx.input(0)?;
    let op = ctx.op_type().to_string();
    let term = match op.as_str() {
        "ReduceL1" => ctx.add(Op::Unary(UnaryOp::Abs), &[x])?,
        _ => ctx.add(Op::Binary(BinaryOp::Mul), &[x, x])?,
    };
    let sum = ctx.add(Op::Reduce { op: ReduceOp::Sum, axes, keep_dims }, &[term])?;
    Ok(vec![match op.as_str() {
        "ReduceL2" => ctx.add(Op::Unary(UnaryOp::Sqrt), &[sum])?,
        _ => sum,
    }])
}
