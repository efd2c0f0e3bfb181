//! Ops that move elements without arithmetic, for every element type: `Reshape`,
//! `Transpose`, `Concat`, `Slice`, `Gather`, `GatherElements`, `Expand`, `Tile`, `Trilu`,
//! `RotateHalf`.

use ndarray::{ArrayD, Axis, Dimension, IxDyn};

use super::elementwise::broadcast_shapes;
use super::OpResult;
use crate::ir::dtype::TensorType;
use crate::ir::op::SliceAxis;
use crate::ir::tensor::{map_array, Element, Tensor};

fn from_vec<T>(shape: &[usize], values: Vec<T>) -> OpResult<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| e.to_string())
}

pub fn infer_reshape(x: &TensorType, shape: &[usize]) -> OpResult<TensorType> {
    if x.len() != shape.iter().product::<usize>() {
        return Err(format!("cannot reshape {:?} to {shape:?}", x.shape));
    }
    Ok(TensorType::new(x.dtype, shape.to_vec()))
}

pub fn eval_reshape(x: &Tensor, shape: &[usize]) -> OpResult<Tensor> {
    infer_reshape(&x.tensor_type(), shape)?;
    x.reshaped(shape).ok_or_else(|| format!("cannot reshape {:?} to {shape:?}", x.shape()))
}

pub fn infer_transpose(x: &TensorType, perm: &[usize]) -> OpResult<TensorType> {
    let mut seen = vec![false; x.rank()];
    if perm.len() != x.rank() || perm.iter().any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true))
    {
        return Err(format!("{perm:?} is not a permutation of rank {}", x.rank()));
    }
    Ok(TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p]).collect()))
}

pub fn eval_transpose(x: &Tensor, perm: &[usize]) -> OpResult<Tensor> {
    infer_transpose(&x.tensor_type(), perm)?;
    Ok(map_array!(x, a => a.clone().permuted_axes(IxDyn(perm)).as_standard_layout().into_owned()))
}

pub fn infer_concat(inputs: &[&TensorType], axis: usize) -> OpResult<TensorType> {
    let first = inputs[0];
    if axis >= first.rank() {
        return Err(format!("Concat axis {axis} out of range for rank {}", first.rank()));
    }
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for t in inputs {
        let same_other_dims =
            t.rank() == first.rank() && (0..t.rank()).all(|i| i == axis || t.shape[i] == first.shape[i]);
        if t.dtype != first.dtype || !same_other_dims {
            return Err(format!("Concat inputs {first} and {t} differ off axis {axis}"));
        }
        shape[axis] += t.shape[axis];
    }
    Ok(TensorType::new(first.dtype, shape))
}

pub fn eval_concat(inputs: &[&Tensor], axis: usize) -> OpResult<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    infer_concat(&types.iter().collect::<Vec<_>>(), axis)?;
    fn concat<T: Element>(first: &ArrayD<T>, inputs: &[&Tensor], axis: usize) -> OpResult<ArrayD<T>> {
        let views: Vec<_> = std::iter::once(Some(first.view()))
            .chain(inputs[1..].iter().map(|t| T::array(t).map(|a| a.view())))
            .collect::<Option<_>>()
            .ok_or("Concat inputs differ in type")?;
        ndarray::concatenate(Axis(axis), &views).map_err(|e| e.to_string())
    }
    Ok(map_array!(inputs[0], first => concat(first, inputs, axis)?))
}

pub fn infer_slice(x: &TensorType, axes: &[SliceAxis]) -> OpResult<TensorType> {
    if axes.len() != x.rank() {
        return Err(format!("Slice has {} axes for rank {}", axes.len(), x.rank()));
    }
    for (i, a) in axes.iter().enumerate() {
        let last = a.start as i64 + a.step * (a.len as i64 - 1);
        if a.len > 0 && (a.step == 0 || last < 0 || last >= x.shape[i] as i64 || a.start >= x.shape[i]) {
            return Err(format!("Slice axis {i} ({a:?}) leaves dim {}", x.shape[i]));
        }
    }
    Ok(TensorType::new(x.dtype, axes.iter().map(|a| a.len).collect()))
}

pub fn eval_slice(x: &Tensor, axes: &[SliceAxis]) -> OpResult<Tensor> {
    infer_slice(&x.tensor_type(), axes)?;
    Ok(map_array!(x, a => {
        let mut v = a.clone();
        for (i, s) in axes.iter().enumerate() {
            let idx: Vec<usize> = (0..s.len).map(|j| (s.start as i64 + s.step * j as i64) as usize).collect();
            v = v.select(Axis(i), &idx);
        }
        v
    }))
}

pub fn infer_gather(data: &TensorType, indices: &TensorType, axis: usize) -> OpResult<TensorType> {
    if axis >= data.rank() {
        return Err(format!("Gather axis {axis} out of range for rank {}", data.rank()));
    }
    if !indices.dtype.is_int() {
        return Err(format!("Gather indices must be integers, got {}", indices.dtype));
    }
    if data.shape[axis] == 0 && !indices.is_empty() {
        return Err(format!(
            "Gather of {} indices along axis {axis} of {data}, which has no entries",
            indices.len()
        ));
    }
    let shape = [&data.shape[..axis], &indices.shape[..], &data.shape[axis + 1..]].concat();
    Ok(TensorType::new(data.dtype, shape))
}

fn resolve_index(i: i64, dim: usize) -> OpResult<usize> {
    let r = if i < 0 { i + dim as i64 } else { i };
    if r < 0 || r >= dim as i64 {
        return Err(format!("index {i} out of range for a dim of {dim}"));
    }
    Ok(r as usize)
}

pub fn eval_gather(data: &Tensor, indices: &Tensor, axis: usize) -> OpResult<Tensor> {
    let out = infer_gather(&data.tensor_type(), &indices.tensor_type(), axis)?;
    let shape = data.shape();
    let (outer, dim) = (shape[..axis].iter().product::<usize>(), shape[axis]);
    let inner = shape[axis + 1..].iter().product::<usize>();
    let idx: Vec<usize> = indices.to_i64().iter().map(|&i| resolve_index(i, dim)).collect::<OpResult<_>>()?;
    Ok(map_array!(data, a => {
        let flat: Vec<_> = a.iter().cloned().collect();
        let mut values = Vec::with_capacity(out.len());
        for o in 0..outer {
            for &i in &idx {
                let base = (o * dim + i) * inner;
                values.extend_from_slice(&flat[base..base + inner]);
            }
        }
        from_vec(&out.shape, values)?
    }))
}

pub fn infer_gather_elements(data: &TensorType, indices: &TensorType, axis: usize) -> OpResult<TensorType> {
    if axis >= data.rank() || indices.rank() != data.rank() {
        return Err(format!("GatherElements needs equal ranks and a valid axis, got {data} / {indices}"));
    }
    if !indices.dtype.is_int() {
        return Err(format!("GatherElements indices must be integers, got {}", indices.dtype));
    }
    if data.shape[axis] == 0 && !indices.is_empty() {
        return Err(format!("GatherElements of {indices} along axis {axis} of {data}, which has no entries"));
    }
    Ok(TensorType::new(data.dtype, indices.shape.clone()))
}

pub fn eval_gather_elements(data: &Tensor, indices: &Tensor, axis: usize) -> OpResult<Tensor> {
    infer_gather_elements(&data.tensor_type(), &indices.tensor_type(), axis)?;
    let idx = indices.to_i64();
    Ok(map_array!(data, a => {
        let mut values = Vec::with_capacity(idx.len());
        for (pos, &i) in idx.indexed_iter() {
            let mut at: Vec<usize> = pos.slice().to_vec();
            at[axis] = resolve_index(i, a.shape()[axis])?;
            if at.iter().zip(a.shape()).any(|(p, d)| p >= d) {
                return Err(format!("GatherElements position {at:?} outside {:?}", a.shape()));
            }
            values.push(a[IxDyn(&at)]);
        }
        from_vec(idx.shape(), values)?
    }))
}

/// How many data axes each index row addresses (the indices' last dim), checked against
/// data's rank, the batch axes and the indices' type.
fn gather_nd_depth(data: &TensorType, indices: &TensorType, batch_dims: usize) -> OpResult<usize> {
    if !indices.dtype.is_int() {
        return Err(format!("GatherND indices must be integers, got {}", indices.dtype));
    }
    let depth = *indices.shape.last().ok_or("GatherND indices must have rank 1 or more")?;
    if batch_dims >= indices.rank() || batch_dims + depth > data.rank() {
        return Err(format!(
            "GatherND with batch_dims {batch_dims}: index rows of {depth} do not fit data {data} / indices {indices}"
        ));
    }
    if data.shape[..batch_dims] != indices.shape[..batch_dims] {
        return Err(format!("GatherND batch axes differ: data {data}, indices {indices}"));
    }
    if !indices.is_empty() && data.shape[batch_dims..batch_dims + depth].contains(&0) {
        return Err(format!("GatherND of {indices} into {data}: an axis it indexes has no entries"));
    }
    Ok(depth)
}

pub fn infer_gather_nd(data: &TensorType, indices: &TensorType, batch_dims: usize) -> OpResult<TensorType> {
    let depth = gather_nd_depth(data, indices, batch_dims)?;
    let shape = [&indices.shape[..indices.rank() - 1], &data.shape[batch_dims + depth..]].concat();
    Ok(TensorType::new(data.dtype, shape))
}

pub fn eval_gather_nd(data: &Tensor, indices: &Tensor, batch_dims: usize) -> OpResult<Tensor> {
    let out = infer_gather_nd(&data.tensor_type(), &indices.tensor_type(), batch_dims)?;
    let depth = gather_nd_depth(&data.tensor_type(), &indices.tensor_type(), batch_dims)?;
    let idx = indices.to_i64();
    let rows: Vec<usize> = idx.shape()[..idx.ndim() - 1].to_vec();
    let flat_idx: Vec<i64> = idx.iter().copied().collect();
    Ok(map_array!(data, a => {
        let dims = a.shape().to_vec();
        let inner: usize = dims[batch_dims + depth..].iter().product();
        let flat: Vec<_> = a.iter().cloned().collect();
        let strides: Vec<usize> = (0..dims.len()).map(|i| dims[i + 1..].iter().product()).collect();
        let mut values = Vec::with_capacity(out.len());
        for r in 0..rows.iter().product::<usize>() {
            // The row's position in the indices' leading axes, for its batch coordinates.
            let mut rest = r;
            let mut position = vec![0usize; rows.len()];
            for (p, &d) in position.iter_mut().zip(&rows).rev() {
                *p = rest % d;
                rest /= d;
            }
            let mut base = 0usize;
            for b in 0..batch_dims {
                base += position[b] * strides[b];
            }
            for t in 0..depth {
                let axis = batch_dims + t;
                base += resolve_index(flat_idx[r * depth + t], dims[axis])? * strides[axis];
            }
            values.extend_from_slice(&flat[base..base + inner]);
        }
        from_vec(&out.shape, values)?
    }))
}

pub fn infer_expand(x: &TensorType, shape: &[usize]) -> OpResult<TensorType> {
    Ok(TensorType::new(x.dtype, broadcast_shapes(&x.shape, shape)?))
}

pub fn eval_expand(x: &Tensor, shape: &[usize]) -> OpResult<Tensor> {
    let out = infer_expand(&x.tensor_type(), shape)?;
    Ok(map_array!(x, a => a.broadcast(IxDyn(&out.shape)).ok_or("Expand does not broadcast")?.to_owned()))
}

pub fn infer_tile(x: &TensorType, repeats: &[usize]) -> OpResult<TensorType> {
    if repeats.len() != x.rank() {
        return Err(format!("Tile has {} repeats for rank {}", repeats.len(), x.rank()));
    }
    Ok(TensorType::new(x.dtype, x.shape.iter().zip(repeats).map(|(d, r)| d * r).collect()))
}

pub fn eval_tile(x: &Tensor, repeats: &[usize]) -> OpResult<Tensor> {
    infer_tile(&x.tensor_type(), repeats)?;
    Ok(map_array!(x, a => {
        let mut v = a.clone();
        for (axis, &r) in repeats.iter().enumerate() {
            let views = vec![v.view(); r];
            v = ndarray::concatenate(Axis(axis), &views).map_err(|e| e.to_string())?;
        }
        v
    }))
}

pub fn infer_trilu(x: &TensorType) -> OpResult<TensorType> {
    if x.rank() < 2 {
        return Err(format!("Trilu needs rank ≥ 2, got {}", x.rank()));
    }
    Ok(x.clone())
}

pub fn eval_trilu(x: &Tensor, upper: bool, k: i64) -> OpResult<Tensor> {
    infer_trilu(&x.tensor_type())?;
    let rank = x.shape().len();
    Ok(map_array!(x, a => {
        let mut v = a.clone();
        for (pos, e) in v.indexed_iter_mut() {
            let (i, j) = (pos[rank - 2] as i64, pos[rank - 1] as i64);
            let keep = if upper { j - i >= k } else { j - i <= k };
            if !keep {
                *e = Default::default();
            }
        }
        v
    }))
}

pub fn infer_rotate_half(x: &TensorType) -> OpResult<TensorType> {
    match x.shape.last() {
        Some(&w) if w % 2 == 0 && x.dtype.is_float() => Ok(x.clone()),
        _ => Err(format!("RotateHalf needs a float tensor whose last axis has even size, got {x}")),
    }
}

/// `concat(-x[.., h:], x[.., :h])` along the last axis.
pub fn eval_rotate_half(x: &Tensor) -> OpResult<Tensor> {
    let ty = infer_rotate_half(&x.tensor_type())?;
    let axis = Axis(ty.rank() - 1);
    let half = ty.shape[ty.rank() - 1] / 2;
    let a = x.to_f64();
    let mut out = a.clone();
    out.slice_axis_mut(axis, (..half).into()).assign(&a.slice_axis(axis, (half..).into()).mapv(|v| -v));
    out.slice_axis_mut(axis, (half..).into()).assign(&a.slice_axis(axis, (..half).into()));
    Ok(Tensor::from_f64(out, ty.dtype))
}
