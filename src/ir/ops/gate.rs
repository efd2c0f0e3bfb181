//! `ChannelGate`: the gate of a squeeze-and-excitation block after its pool's first stage,
//! `gate(W₂ᵀ · hidden(W₁ᵀ · mean(x) + b₁) + b₂)` per sample, as one op (the
//! `squeeze-excite` pass makes it; `codegen/gate.rs` runs it as one kernel).
//!
//! Inputs: `x [N, …, C]` (averaged over every axis but the first and the last), `w1 [C, H]`,
//! `b1 [H]`, `w2 [H', C]` with `H' ≥ H` (rows past `H` are the zero padding a GEMM's
//! alignment added and are not read), `b2 [C]`. Output `[N, 1, …, 1, C]` of x's rank; or,
//! given a sixth input `wp [C, O]` (the weights of the 1×1 projection that reads the scaled
//! activations), the gate folded into them: `[N, C, O]`, `gate[n, c] · wp[c, o]`, so that the
//! projection of sample n is `x[n] · out[n]` and the scaled activations are never written.

use ndarray::{ArrayD, IxDyn};

use super::OpResult;
use crate::ir::dtype::TensorType;
use crate::ir::tensor::Tensor;

/// The most channels and hidden units of a gate together: its kernel keeps the pooled
/// channels and the hidden units in shared memory (28 KB, beside 17 KB of partial sums).
pub const MAX_WIDTH: usize = 7168;

/// A pointwise activation inside a [`crate::ir::Op::ChannelGate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GateActivation {
    /// `x`.
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// `x · σ(x)`.
    Silu,
    /// `σ(x)`.
    Sigmoid,
    /// `clamp(α·x + β, 0, 1)`.
    HardSigmoid {
        /// α.
        alpha: f32,
        /// β.
        beta: f32,
    },
}

impl GateActivation {
    /// The activation at `x`, in f64 (the reference).
    pub fn apply(self, x: f64) -> f64 {
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        match self {
            GateActivation::Identity => x,
            GateActivation::Relu => x.max(0.0),
            GateActivation::Silu => x * sigmoid(x),
            GateActivation::Sigmoid => sigmoid(x),
            GateActivation::HardSigmoid { alpha, beta } => {
                (f64::from(alpha) * x + f64::from(beta)).clamp(0.0, 1.0)
            }
        }
    }

    /// The activation of f32 `x` in CUDA C.
    pub fn cuda(self, x: &str) -> String {
        match self {
            GateActivation::Identity => x.to_string(),
            GateActivation::Relu => format!("fmaxf({x}, 0.0f)"),
            GateActivation::Silu => format!("({x} / (1.0f + __expf(-{x})))"),
            GateActivation::Sigmoid => format!("(1.0f / (1.0f + __expf(-{x})))"),
            GateActivation::HardSigmoid { alpha, beta } => {
                format!("fminf(fmaxf({alpha:e}f * {x} + {beta:e}f, 0.0f), 1.0f)")
            }
        }
    }
}

/// `(N, C, H)` of a gate over inputs of these types, or why they do not fit.
pub fn gate_sizes(inputs: &[&TensorType]) -> OpResult<(usize, usize, usize)> {
    let [x, w1, b1, w2, b2, rest @ ..] = inputs else {
        return Err(format!("ChannelGate takes 5 inputs, got {}", inputs.len()));
    };
    let (Some(&n), Some(&c)) = (x.shape.first(), x.shape.last()) else {
        return Err("ChannelGate of a scalar".into());
    };
    if x.rank() < 2 || !x.dtype.is_float() {
        return Err(format!("ChannelGate of {x}"));
    }
    let hidden = match (w1.shape.as_slice(), w2.shape.as_slice()) {
        ([k, h], [h2, c2]) if *k == c && *c2 == c && h2 >= h => *h,
        _ => return Err(format!("ChannelGate weights {w1} and {w2} for {c} channels")),
    };
    if c + hidden > MAX_WIDTH {
        return Err(format!("ChannelGate of {c} channels through {hidden}: at most {MAX_WIDTH} together"));
    }
    if b1.shape != [hidden] || b2.shape != [c] {
        return Err(format!("ChannelGate biases {b1} and {b2} for {hidden} and {c}"));
    }
    if [*w1, *b1, *w2, *b2].iter().chain(rest).any(|t| t.dtype != x.dtype) {
        return Err("ChannelGate inputs of different types".into());
    }
    match rest {
        [] => {}
        [wp] if wp.rank() == 2 && wp.shape[0] == c => {}
        _ => return Err(format!("ChannelGate projection {:?} for {c} channels", rest)),
    }
    Ok((n, c, hidden))
}

pub fn infer_gate(inputs: &[&TensorType]) -> OpResult<TensorType> {
    let (n, c, _) = gate_sizes(inputs)?;
    let x = inputs[0];
    if let Some(wp) = inputs.get(5) {
        return Ok(TensorType::new(x.dtype, vec![n, c, wp.shape[1]]));
    }
    let mut shape = vec![1; x.rank()];
    shape[0] = x.shape[0];
    shape[x.rank() - 1] = x.shape[x.rank() - 1];
    Ok(TensorType::new(x.dtype, shape))
}

pub fn eval_gate(inputs: &[&Tensor], hidden: GateActivation, gate: GateActivation) -> OpResult<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type()).collect();
    let (n, c, h) = gate_sizes(&types.iter().collect::<Vec<_>>())?;
    let out = infer_gate(&types.iter().collect::<Vec<_>>())?;
    let [x, w1, b1, w2, b2] = [0, 1, 2, 3, 4].map(|i| inputs[i].to_f64_vec());
    let projection = inputs.get(5).map(|wp| (wp.shape()[1], wp.to_f64_vec()));
    let per = x.len() / (n * c).max(1);
    let mut result = Vec::with_capacity(n * c);
    for s in 0..n {
        let sample = &x[s * per * c..(s + 1) * per * c];
        let mean: Vec<f64> =
            (0..c).map(|k| (0..per).map(|p| sample[p * c + k]).sum::<f64>() / per as f64).collect();
        let inner: Vec<f64> = (0..h)
            .map(|j| hidden.apply(b1[j] + (0..c).map(|k| mean[k] * w1[k * h + j]).sum::<f64>()))
            .collect();
        let gates = (0..c).map(|k| gate.apply(b2[k] + (0..h).map(|j| inner[j] * w2[j * c + k]).sum::<f64>()));
        match &projection {
            None => result.extend(gates),
            Some((o, wp)) => {
                for (k, g) in gates.enumerate() {
                    result.extend(wp[k * o..(k + 1) * o].iter().map(|w| g * w));
                }
            }
        }
    }
    let values = ArrayD::from_shape_vec(IxDyn(&out.shape), result).map_err(|e| e.to_string())?;
    Ok(Tensor::from_f64(values, out.dtype))
}
