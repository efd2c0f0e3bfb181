//! 2-D pooling over NCHW (or NHWC) windows: `MaxPool`, `AveragePool` (the global pools are
//! reductions).
//! The evaluator works in f64.

use ndarray::{ArrayD, IxDyn};

use super::OpResult;
use crate::ir::dtype::TensorType;
use crate::ir::op::{PoolKind, PoolWindow};
use crate::ir::tensor::Tensor;

/// Output extent of one pooled axis. With `ceil`, a last window that would start past the
/// input and its start padding (in the end padding alone) is dropped, as ONNX specifies.
pub fn pool_extent(
    input: usize,
    kernel: usize,
    stride: usize,
    pads: (usize, usize),
    dilation: usize,
    ceil: bool,
) -> OpResult<usize> {
    let span = dilation * kernel.saturating_sub(1) + 1;
    let padded = input + pads.0 + pads.1;
    let steps = padded.checked_sub(span).ok_or_else(|| {
        format!("a pooling window spanning {span} is larger than the padded input {padded}")
    })?;
    let stride = stride.max(1);
    let mut out = if ceil { steps.div_ceil(stride) + 1 } else { steps / stride + 1 };
    if ceil && out > 1 && (out - 1) * stride >= input + pads.0 {
        out -= 1;
    }
    Ok(out)
}

/// The window positions (input coordinates, possibly outside it) of output `o` along one axis.
pub fn window_taps(o: usize, axis: usize, window: &PoolWindow) -> impl Iterator<Item = isize> + '_ {
    (0..window.kernel[axis]).map(move |k| {
        (o * window.strides[axis] + k * window.dilations[axis]) as isize - window.pads[axis] as isize
    })
}

pub fn infer_pool(x: &TensorType, window: &PoolWindow) -> OpResult<TensorType> {
    if !x.dtype.is_float() {
        return Err(format!("pooling needs floating-point input, got {}", x.dtype));
    }
    if x.rank() != 4 {
        return Err(format!("only 2-D pooling (NCHW) is supported, got {x}"));
    }
    if window.channels_last {
        let nchw = TensorType::new(x.dtype, vec![x.shape[0], x.shape[3], x.shape[1], x.shape[2]]);
        let out = infer_pool(&nchw, &PoolWindow { channels_last: false, ..*window })?;
        let s = &out.shape;
        return Ok(TensorType::new(out.dtype, vec![s[0], s[2], s[3], s[1]]));
    }
    if window.kernel.contains(&0) || window.strides.contains(&0) || window.dilations.contains(&0) {
        return Err(format!(
            "a pooling window of kernel {:?}, strides {:?}, dilations {:?}",
            window.kernel, window.strides, window.dilations
        ));
    }
    let extent = |a: usize| {
        pool_extent(
            x.shape[2 + a],
            window.kernel[a],
            window.strides[a],
            (window.pads[a], window.pads[a + 2]),
            window.dilations[a],
            window.ceil_mode,
        )
    };
    Ok(TensorType::new(x.dtype, vec![x.shape[0], x.shape[1], extent(0)?, extent(1)?]))
}

pub fn eval_pool(x: &Tensor, kind: PoolKind, window: &PoolWindow) -> OpResult<Tensor> {
    if window.channels_last {
        let nchw = x.to_f64().permuted_axes(IxDyn(&[0, 3, 1, 2])).as_standard_layout().to_owned();
        let pooled = eval_pool(
            &Tensor::from_f64(nchw, x.dtype()),
            kind,
            &PoolWindow { channels_last: false, ..*window },
        )?;
        let nhwc = pooled.to_f64().permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().to_owned();
        return Ok(Tensor::from_f64(nhwc, x.dtype()));
    }
    let out = infer_pool(&x.tensor_type(), window)?;
    let values = x.to_f64();
    let (xs, os) = (values.shape().to_vec(), out.shape.clone());
    let inside = |i: isize, axis: usize| i >= 0 && (i as usize) < xs[2 + axis];
    let padded = |i: isize, axis: usize| {
        i >= -(window.pads[axis] as isize) && i < (xs[2 + axis] + window.pads[axis + 2]) as isize
    };
    let mut y = ArrayD::<f64>::zeros(IxDyn(&os));
    for n in 0..os[0] {
        for c in 0..os[1] {
            for oh in 0..os[2] {
                for ow in 0..os[3] {
                    let (mut best, mut sum, mut count) = (f64::NEG_INFINITY, 0.0, 0usize);
                    for ih in window_taps(oh, 0, window) {
                        for iw in window_taps(ow, 1, window) {
                            let within = inside(ih, 0) && inside(iw, 1);
                            if within {
                                let v = values[[n, c, ih as usize, iw as usize]];
                                best = best.max(v);
                                sum += v;
                            }
                            let counted = match kind {
                                PoolKind::Average { count_include_pad: true } => {
                                    padded(ih, 0) && padded(iw, 1)
                                }
                                _ => within,
                            };
                            count += usize::from(counted);
                        }
                    }
                    y[[n, c, oh, ow]] = match kind {
                        PoolKind::Max => best,
                        PoolKind::Average { .. } => sum / count as f64,
                    };
                }
            }
        }
    }
    Ok(Tensor::from_f64(y, out.dtype))
}
