//! Data movement: `Reshape`, `Squeeze`, `Unsqueeze`, `Flatten` (all become `Reshape`),
//! `Transpose`, `Concat`, `Split` (one `Slice` per output), `Slice`, `Gather`,
//! `GatherElements`, `Expand`, `Tile`, `Trilu`.

use super::Registry;
use crate::import::context::{NodeCtx, Translated};
use crate::import::ImportError;
use crate::ir::{Op, SliceAxis};

pub(super) fn register(reg: &mut Registry) {
    reg.insert("Reshape", reshape);
    reg.insert("Squeeze", squeeze);
    reg.insert("Unsqueeze", unsqueeze);
    reg.insert("Flatten", flatten);
    reg.insert("Transpose", transpose);
    reg.insert("Concat", concat);
    reg.insert("Split", split);
    reg.insert("Slice", slice);
    reg.insert("Gather", gather);
    reg.insert("GatherElements", gather_elements);
    reg.insert("GatherND", gather_nd);
    reg.insert("Expand", expand);
    reg.insert("Tile", tile);
    reg.insert("Trilu", trilu);
}

fn as_sizes(ctx: &NodeCtx, values: &[i64], what: &str) -> Result<Vec<usize>, ImportError> {
    values
        .iter()
        .map(|&v| {
            usize::try_from(v).map_err(|_| ctx.error(format!("{what} {values:?} has a negative entry")))
        })
        .collect()
}

fn reshape_to(ctx: &mut NodeCtx, shape: Vec<usize>) -> Translated {
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Reshape { shape }, &[x])?])
}

fn reshape(ctx: &mut NodeCtx) -> Translated {
    let input = ctx.ty(0)?;
    let spec = ctx.const_ints(1, "target shape")?;
    let allow_zero = ctx.attr_int("allowzero")?.unwrap_or(0) != 0;
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        shape.push(match d {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                1
            }
            0 if !allow_zero => *input
                .shape
                .get(i)
                .ok_or_else(|| ctx.error(format!("shape {spec:?} copies dim {i} the input lacks")))?,
            d if d >= 0 => d as usize,
            _ => return Err(ctx.error(format!("target shape {spec:?} is not valid"))),
        });
    }
    if let Some(i) = infer_at {
        let known: usize = shape.iter().product();
        if known == 0 || input.len() % known != 0 {
            return Err(ctx.error(format!("cannot reshape {input} to {spec:?}")));
        }
        shape[i] = input.len() / known;
    }
    reshape_to(ctx, shape)
}

fn axes_operand(ctx: &NodeCtx, became_input: i64) -> Result<Option<Vec<i64>>, ImportError> {
    if ctx.opset >= became_input {
        ctx.opt_const_ints(1, "axes")
    } else {
        ctx.attr_ints("axes")
    }
}

fn squeeze(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let axes = match axes_operand(ctx, 13)? {
        Some(axes) => ctx.axes(&axes, ty.rank())?,
        None => (0..ty.rank()).filter(|&i| ty.shape[i] == 1).collect(),
    };
    if let Some(&bad) = axes.iter().find(|&&a| ty.shape[a] != 1) {
        return Err(ctx.error(format!("cannot squeeze axis {bad} of {ty}")));
    }
    let shape = (0..ty.rank()).filter(|i| !axes.contains(i)).map(|i| ty.shape[i]).collect();
    reshape_to(ctx, shape)
}

fn unsqueeze(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let axes = axes_operand(ctx, 13)?.ok_or_else(|| ctx.error("axes are required"))?;
    let rank = ty.rank() + axes.len();
    let axes = ctx.axes(&axes, rank)?;
    let mut dims = ty.shape.iter();
    let shape = (0..rank)
        .map(|i| if axes.contains(&i) { Some(1) } else { dims.next().copied() })
        .collect::<Option<Vec<_>>>();
    let shape = shape.ok_or_else(|| ctx.error(format!("axes {axes:?} repeat an axis")))?;
    reshape_to(ctx, shape)
}

fn flatten(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let axis = ctx.attr_int("axis")?.unwrap_or(1);
    let axis = if axis == ty.rank() as i64 { ty.rank() } else { ctx.axis(axis, ty.rank())? };
    let outer = ty.shape[..axis].iter().product();
    reshape_to(ctx, vec![outer, ty.shape[axis..].iter().product()])
}

fn transpose(ctx: &mut NodeCtx) -> Translated {
    let rank = ctx.rank(0)?;
    let perm = match ctx.attr_ints("perm")? {
        Some(p) => ctx.axes(&p, rank)?,
        None => (0..rank).rev().collect(),
    };
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Transpose { perm }, &[x])?])
}

fn concat(ctx: &mut NodeCtx) -> Translated {
    let rank = ctx.rank(0)?;
    let axis = ctx.axis(ctx.attr_int("axis")?.ok_or_else(|| ctx.error("axis is required"))?, rank)?;
    let inputs: Vec<_> = (0..ctx.inputs.len()).map(|i| ctx.input(i)).collect::<Result<_, _>>()?;
    Ok(vec![ctx.add(Op::Concat { axis }, &inputs)?])
}

fn whole_axes(shape: &[usize]) -> Vec<SliceAxis> {
    shape.iter().map(|&len| SliceAxis { start: 0, step: 1, len }).collect()
}

fn split(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(0), ty.rank())?;
    let outputs = ctx.proto.output.clone();
    let dim = ty.shape[axis];
    let sizes = match if ctx.opset >= 13 { ctx.opt_const_ints(1, "split")? } else { ctx.attr_ints("split")? }
    {
        Some(s) => as_sizes(ctx, &s, "split")?,
        None => {
            let n = ctx.attr_int("num_outputs")?.map_or(outputs.len(), |n| n.max(1) as usize);
            let chunk = dim.div_ceil(n);
            (0..n).map(|i| chunk.min(dim.saturating_sub(i * chunk))).collect()
        }
    };
    if sizes.len() != outputs.len() || sizes.iter().sum::<usize>() != dim {
        return Err(
            ctx.error(format!("split sizes {sizes:?} do not cover dim {dim} in {} outputs", outputs.len()))
        );
    }
    let x = ctx.input(0)?;
    let mut start = 0;
    let mut ids = Vec::with_capacity(sizes.len());
    for (len, name) in sizes.into_iter().zip(&outputs) {
        let mut axes = whole_axes(&ty.shape);
        axes[axis] = SliceAxis { start, step: 1, len };
        ids.push(ctx.add_named(Op::Slice { axes }, &[x], name)?);
        start += len;
    }
    Ok(ids)
}

/// ONNX slice bounds for one axis: negative values count from the end, then clamp.
fn slice_axis(start: i64, end: i64, step: i64, dim: usize) -> SliceAxis {
    let dim = dim as i64;
    let wrap = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (start, end) = (wrap(start), wrap(end));
    let (start, len) = if step > 0 {
        let (s, e) = (start.clamp(0, dim), end.clamp(0, dim));
        (s, if e > s { (e - s + step - 1) / step } else { 0 })
    } else {
        let (s, e) = (start.clamp(-1, dim - 1), end.clamp(-1, dim - 1));
        (s, if s > e { (s - e + (-step) - 1) / (-step) } else { 0 })
    };
    SliceAxis { start: start.max(0) as usize, step, len: len as usize }
}

fn slice(ctx: &mut NodeCtx) -> Translated {
    let ty = ctx.ty(0)?;
    let (starts, ends, axes, steps) = if ctx.opset >= 10 {
        (
            ctx.const_ints(1, "starts")?,
            ctx.const_ints(2, "ends")?,
            ctx.opt_const_ints(3, "axes")?,
            ctx.opt_const_ints(4, "steps")?,
        )
    } else {
        let need = |name| ctx.attr_ints(name)?.ok_or_else(|| ctx.error(format!("{name} is required")));
        (need("starts")?, need("ends")?, ctx.attr_ints("axes")?, None)
    };
    let axes = match axes {
        Some(a) => ctx.axes(&a, ty.rank())?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(ctx.error("starts, ends, axes and steps differ in length"));
    }
    let mut out = whole_axes(&ty.shape);
    for i in 0..starts.len() {
        if steps[i] == 0 {
            return Err(ctx.error("a slice step is 0"));
        }
        out[axes[i]] = slice_axis(starts[i], ends[i], steps[i], ty.shape[axes[i]]);
    }
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Slice { axes: out }, &[x])?])
}

fn gather(ctx: &mut NodeCtx) -> Translated {
    let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(0), ctx.rank(0)?)?;
    let (data, indices) = (ctx.input(0)?, ctx.input(1)?);
    Ok(vec![ctx.add(Op::Gather { axis }, &[data, indices])?])
}

fn gather_nd(ctx: &mut NodeCtx) -> Translated {
    let batch_dims = ctx.attr_int("batch_dims")?.unwrap_or(0);
    let batch_dims =
        usize::try_from(batch_dims).map_err(|_| ctx.error(format!("batch_dims {batch_dims} is negative")))?;
    let (data, indices) = (ctx.input(0)?, ctx.input(1)?);
    Ok(vec![ctx.add(Op::GatherNd { batch_dims }, &[data, indices])?])
}

fn gather_elements(ctx: &mut NodeCtx) -> Translated {
    let axis = ctx.axis(ctx.attr_int("axis")?.unwrap_or(0), ctx.rank(0)?)?;
    let (data, indices) = (ctx.input(0)?, ctx.input(1)?);
    Ok(vec![ctx.add(Op::GatherElements { axis }, &[data, indices])?])
}

fn expand(ctx: &mut NodeCtx) -> Translated {
    let shape = ctx.const_ints(1, "shape")?;
    let shape = as_sizes(ctx, &shape, "shape")?;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Expand { shape }, &[x])?])
}

fn tile(ctx: &mut NodeCtx) -> Translated {
    let repeats = ctx.const_ints(1, "repeats")?;
    let repeats = as_sizes(ctx, &repeats, "repeats")?;
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Tile { repeats }, &[x])?])
}

fn trilu(ctx: &mut NodeCtx) -> Translated {
    let upper = ctx.attr_int("upper")?.unwrap_or(1) != 0;
    let k = match ctx.opt_const_ints(1, "k")?.as_deref() {
        None => 0,
        Some([k]) => *k,
        Some(other) => return Err(ctx.error(format!("k must hold one value, got {other:?}"))),
    };
    let x = ctx.input(0)?;
    Ok(vec![ctx.add(Op::Trilu { upper, k }, &[x])?])
}

#[cfg(test)]
mod tests {
    use super::slice_axis;

    #[test]
    fn slice_bounds_follow_onnx() {
        let s = |a, b, c, d| {
            let r = slice_axis(a, b, c, d);
            (r.start, r.step, r.len)
        };
        assert_eq!(s(0, i64::MAX, 1, 5), (0, 1, 5));
        assert_eq!(s(1, -1, 3, 22), (1, 3, 7));
        assert_eq!(s(-1, i64::MIN, -1, 4), (3, -1, 4));
        assert_eq!(s(-2, -10, -2, 5), (3, -2, 2));
        assert_eq!(s(4, 2, 1, 5).2, 0);
    }
}
