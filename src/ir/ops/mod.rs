//! Static type inference and CPU evaluation of every op, one file per op family.
//! [`infer`] and [`evaluate`] are the only dispatch over [`Op`].

pub mod elementwise;
pub mod gate;
pub mod layout;
pub mod linalg;
pub mod pool;
pub mod reduce;

use super::dtype::TensorType;
use super::op::Op;
use super::tensor::Tensor;

/// Op-level errors carry a message; the graph adds which node it was.
pub type OpResult<T> = Result<T, String>;

fn check_arity(op: &Op, count: usize) -> OpResult<()> {
    let (least, most) = op.arity();
    if count < least || count > most {
        let want = if least == most { least.to_string() } else { format!("{least}..={most}") };
        return Err(format!("{} takes {want} inputs, got {count}", op.kind()));
    }
    Ok(())
}

/// The output type of `op` applied to inputs of types `inputs`.
pub fn infer(op: &Op, inputs: &[&TensorType]) -> OpResult<TensorType> {
    check_arity(op, inputs.len())?;
    let x = || inputs[0];
    match op {
        Op::Input { .. } => Err("an Input's type is given, not inferred".into()),
        Op::Constant(t) => Ok(t.tensor_type()),
        Op::Unary(u) => elementwise::infer_unary(*u, x()),
        Op::Binary(b) => elementwise::infer_binary(*b, x(), inputs[1]),
        Op::Where => elementwise::infer_where(x(), inputs[1], inputs[2]),
        Op::Cast { to } => Ok(TensorType::new(*to, x().shape.clone())),
        Op::Clip { .. } | Op::Dropout | Op::Identity => Ok(x().clone()),
        Op::MatMul => linalg::infer_matmul(x(), inputs[1]),
        Op::Gemm { trans_a, trans_b, .. } => linalg::infer_gemm(inputs, *trans_a, *trans_b),
        Op::Conv { strides, pads, dilations, group, channels_last: false } => {
            linalg::infer_conv(inputs, *strides, *pads, *dilations, *group)
        }
        Op::Conv { strides, pads, dilations, group, channels_last: true } => {
            linalg::infer_conv_nhwc(inputs, *strides, *pads, *dilations, *group)
        }
        Op::Pool { window, .. } => pool::infer_pool(x(), window),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => reduce::infer_softmax(x(), *axis),
        Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => reduce::infer_layer_norm(inputs, *axis),
        Op::Attention { .. } => linalg::infer_attention(inputs),
        Op::Reduce { op, axes, keep_dims } => reduce::infer_reduce(x(), *op, axes, *keep_dims),
        Op::CumSum { axis, .. } => reduce::infer_cumsum(x(), *axis),
        Op::Reshape { shape } => layout::infer_reshape(x(), shape),
        Op::Transpose { perm } => layout::infer_transpose(x(), perm),
        Op::Concat { axis } | Op::Append { axis } => layout::infer_concat(inputs, *axis),
        Op::Slice { axes } => layout::infer_slice(x(), axes),
        Op::Gather { axis } => layout::infer_gather(x(), inputs[1], *axis),
        Op::GatherElements { axis } => layout::infer_gather_elements(x(), inputs[1], *axis),
        Op::GatherNd { batch_dims } => layout::infer_gather_nd(x(), inputs[1], *batch_dims),
        Op::Expand { shape } => layout::infer_expand(x(), shape),
        Op::Tile { repeats } => layout::infer_tile(x(), repeats),
        Op::Trilu { .. } => layout::infer_trilu(x()),
        Op::RotateHalf => layout::infer_rotate_half(x()),
        Op::ChannelGate { .. } => gate::infer_gate(inputs),
    }
}

/// Evaluates `op` on host tensors: the reference semantics every later stage must keep.
pub fn evaluate(op: &Op, inputs: &[&Tensor]) -> OpResult<Tensor> {
    check_arity(op, inputs.len())?;
    let x = || inputs[0];
    match op {
        Op::Input { name } => Err(format!("Input \"{name}\" has no value to compute")),
        Op::Constant(t) => Ok(t.as_ref().clone()),
        Op::Unary(u) => elementwise::eval_unary(*u, x()),
        Op::Binary(b) => elementwise::eval_binary(*b, x(), inputs[1]),
        Op::Where => elementwise::eval_where(x(), inputs[1], inputs[2]),
        Op::Cast { to } => Ok(x().cast(*to)),
        Op::Clip { min, max } => Ok(elementwise::eval_clip(x(), *min, *max)),
        Op::Dropout | Op::Identity => Ok(x().clone()),
        Op::MatMul => linalg::eval_matmul(x(), inputs[1]),
        Op::Gemm { alpha, beta, trans_a, trans_b } => {
            linalg::eval_gemm(inputs, *alpha, *beta, *trans_a, *trans_b)
        }
        Op::Conv { strides, pads, dilations, group, channels_last: false } => {
            linalg::eval_conv(inputs, *strides, *pads, *dilations, *group)
        }
        Op::Conv { strides, pads, dilations, group, channels_last: true } => {
            linalg::eval_conv_nhwc(inputs, *strides, *pads, *dilations, *group)
        }
        Op::Pool { kind, window } => pool::eval_pool(x(), *kind, window),
        Op::Softmax { axis } => reduce::eval_softmax(x(), *axis, false),
        Op::LogSoftmax { axis } => reduce::eval_softmax(x(), *axis, true),
        Op::LayerNorm { axis, epsilon } => reduce::eval_layer_norm(inputs, *axis, *epsilon),
        Op::RmsNorm { axis, epsilon, deviation } => {
            reduce::eval_rms_norm(inputs, *axis, *epsilon, *deviation)
        }
        Op::Attention { scale, nan_to_zero } => linalg::eval_attention(inputs, *scale, *nan_to_zero),
        Op::Reduce { op, axes, keep_dims } => reduce::eval_reduce(x(), *op, axes, *keep_dims),
        Op::CumSum { axis, exclusive, reverse } => reduce::eval_cumsum(x(), *axis, *exclusive, *reverse),
        Op::Reshape { shape } => layout::eval_reshape(x(), shape),
        Op::Transpose { perm } => layout::eval_transpose(x(), perm),
        Op::Concat { axis } | Op::Append { axis } => layout::eval_concat(inputs, *axis),
        Op::Slice { axes } => layout::eval_slice(x(), axes),
        Op::Gather { axis } => layout::eval_gather(x(), inputs[1], *axis),
        Op::GatherElements { axis } => layout::eval_gather_elements(x(), inputs[1], *axis),
        Op::GatherNd { batch_dims } => layout::eval_gather_nd(x(), inputs[1], *batch_dims),
        Op::Expand { shape } => layout::eval_expand(x(), shape),
        Op::Tile { repeats } => layout::eval_tile(x(), repeats),
        Op::Trilu { upper, k } => layout::eval_trilu(x(), *upper, *k),
        Op::RotateHalf => layout::eval_rotate_half(x()),
        Op::ChannelGate { hidden, gate } => gate::eval_gate(inputs, *hidden, *gate),
    }
}
