//! Pointwise ops: unary math, binary arithmetic and comparisons with broadcasting, `Where`,
//! `Cast`, `Clip`. Floats compute in f64 and round to the output type; integers stay exact.

use ndarray::{ArrayD, IxDyn, Zip};

use super::OpResult;
use crate::ir::dtype::{DType, TensorType};
use crate::ir::op::{BinaryOp, UnaryOp};
use crate::ir::tensor::Tensor;

/// numpy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> OpResult<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i < rank - s.len() {
            1
        } else {
            s[i - (rank - s.len())]
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            (x, y) => Err(format!("shapes {a:?} and {b:?} do not broadcast (axis {i}: {x} vs {y})")),
        })
        .collect()
}

fn broadcast<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> OpResult<ArrayD<T>> {
    a.broadcast(IxDyn(shape))
        .map(|v| v.to_owned())
        .ok_or_else(|| format!("cannot broadcast {:?} to {shape:?}", a.shape()))
}

pub fn infer_unary(op: UnaryOp, x: &TensorType) -> OpResult<TensorType> {
    match op {
        UnaryOp::Not if x.dtype != DType::Bool => Err(format!("Not needs bool, got {}", x.dtype)),
        UnaryOp::Not => Ok(x.clone()),
        UnaryOp::IsNaN => Ok(TensorType::new(DType::Bool, x.shape.clone())),
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu if x.dtype != DType::Bool => Ok(x.clone()),
        _ if x.dtype.is_float() => Ok(x.clone()),
        _ => Err(format!("{op:?} needs a floating-point input, got {}", x.dtype)),
    }
}

pub fn unary_f64(op: UnaryOp, v: f64) -> f64 {
    match op {
        UnaryOp::Neg => -v,
        UnaryOp::Abs => v.abs(),
        UnaryOp::Sqrt => v.sqrt(),
        UnaryOp::Reciprocal => 1.0 / v,
        UnaryOp::Exp => v.exp(),
        UnaryOp::Log => v.ln(),
        UnaryOp::Erf => erf(v),
        UnaryOp::Tanh => v.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        UnaryOp::Relu => v.max(0.0),
        UnaryOp::Sin => v.sin(),
        UnaryOp::Cos => v.cos(),
        UnaryOp::Gelu => 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)),
        UnaryOp::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh())
        }
        UnaryOp::Not => (v == 0.0) as u8 as f64,
        UnaryOp::IsNaN => v.is_nan() as u8 as f64,
        UnaryOp::NanToZero if v.is_nan() => 0.0,
        UnaryOp::NanToZero => v,
    }
}

pub fn eval_unary(op: UnaryOp, x: &Tensor) -> OpResult<Tensor> {
    match op {
        UnaryOp::Not => Ok(Tensor::Bool(x.to_bool().mapv(|b| !b))),
        UnaryOp::IsNaN => Ok(Tensor::Bool(x.to_f64().mapv(f64::is_nan))),
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu if x.dtype().is_int() => {
            let f = |v: i64| match op {
                UnaryOp::Neg => -v,
                UnaryOp::Abs => v.abs(),
                _ => v.max(0),
            };
            Ok(Tensor::from_i64(x.to_i64().mapv(f), x.dtype()))
        }
        _ => Ok(Tensor::from_f64(x.to_f64().mapv(|v| unary_f64(op, v)), x.dtype())),
    }
}

pub fn infer_binary(op: BinaryOp, a: &TensorType, b: &TensorType) -> OpResult<TensorType> {
    let shape = broadcast_shapes(&a.shape, &b.shape)?;
    let dtype = match op {
        BinaryOp::And if a.dtype == DType::Bool && b.dtype == DType::Bool => DType::Bool,
        BinaryOp::And => return Err(format!("And needs bool inputs, got {} and {}", a.dtype, b.dtype)),
        // Pow's exponent may have its own type; the result has the base's.
        BinaryOp::Pow if a.dtype != DType::Bool && b.dtype != DType::Bool => a.dtype,
        _ if a.dtype != b.dtype => {
            return Err(format!("{op:?} inputs differ in type: {} and {}", a.dtype, b.dtype))
        }
        _ if op.is_comparison() => DType::Bool,
        _ if a.dtype == DType::Bool => {
            return Err(format!("{op:?} is not defined on bool"));
        }
        _ => a.dtype,
    };
    Ok(TensorType::new(dtype, shape))
}

/// The remainder with the divisor's sign, as numpy's `mod`: C's `fmod` moved by one divisor
/// where the signs differ, a zero taking the divisor's sign (`-3 mod ∞` is ∞).
fn floor_mod(x: f64, y: f64) -> f64 {
    let r = x % y;
    if r != 0.0 && (r < 0.0) != (y < 0.0) {
        r + y
    } else if r == 0.0 {
        0.0f64.copysign(y)
    } else {
        r
    }
}

pub fn binary_f64(op: BinaryOp, x: f64, y: f64) -> f64 {
    let truth = |b: bool| b as u8 as f64;
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Mod => floor_mod(x, y),
        BinaryOp::Fmod => x % y,
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        BinaryOp::Equal => truth(x == y),
        BinaryOp::Less => truth(x < y),
        BinaryOp::LessOrEqual => truth(x <= y),
        BinaryOp::Greater => truth(x > y),
        BinaryOp::GreaterOrEqual => truth(x >= y),
        BinaryOp::And => truth(x != 0.0 && y != 0.0),
    }
}

fn binary_i64(op: BinaryOp, x: i64, y: i64) -> OpResult<i64> {
    Ok(match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Div if y == 0 => return Err("integer division by zero".into()),
        // Truncating division, as ONNX runtimes do for integers.
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.pow(u32::try_from(y).map_err(|_| format!("negative exponent {y}"))?),
        BinaryOp::Mod | BinaryOp::Fmod if y == 0 => return Err("integer remainder by zero".into()),
        BinaryOp::Mod => match x.wrapping_rem(y) {
            r if r != 0 && (r < 0) != (y < 0) => r + y,
            r => r,
        },
        BinaryOp::Fmod => x.wrapping_rem(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        BinaryOp::Equal => (x == y) as i64,
        BinaryOp::Less => (x < y) as i64,
        BinaryOp::LessOrEqual => (x <= y) as i64,
        BinaryOp::Greater => (x > y) as i64,
        BinaryOp::GreaterOrEqual => (x >= y) as i64,
        BinaryOp::And => (x != 0 && y != 0) as i64,
    })
}

pub fn eval_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let out = infer_binary(op, &a.tensor_type(), &b.tensor_type())?;
    if a.dtype().is_float() || b.dtype().is_float() {
        let x = broadcast(&a.to_f64(), &out.shape)?;
        let y = broadcast(&b.to_f64(), &out.shape)?;
        let values = Zip::from(&x).and(&y).map_collect(|&x, &y| binary_f64(op, x, y));
        return Ok(Tensor::from_f64(values, out.dtype));
    }
    let x = broadcast(&a.to_i64(), &out.shape)?;
    let y = broadcast(&b.to_i64(), &out.shape)?;
    let values: Vec<i64> =
        x.iter().zip(y.iter()).map(|(&x, &y)| binary_i64(op, x, y)).collect::<OpResult<_>>()?;
    let values = ArrayD::from_shape_vec(IxDyn(&out.shape), values).map_err(|e| e.to_string())?;
    Ok(Tensor::from_i64(values, out.dtype))
}

pub fn infer_where(c: &TensorType, x: &TensorType, y: &TensorType) -> OpResult<TensorType> {
    if c.dtype != DType::Bool {
        return Err(format!("Where's condition must be bool, got {}", c.dtype));
    }
    if x.dtype != y.dtype {
        return Err(format!("Where's branches differ in type: {} and {}", x.dtype, y.dtype));
    }
    let shape = broadcast_shapes(&broadcast_shapes(&c.shape, &x.shape)?, &y.shape)?;
    Ok(TensorType::new(x.dtype, shape))
}

pub fn eval_where(c: &Tensor, x: &Tensor, y: &Tensor) -> OpResult<Tensor> {
    let out = infer_where(&c.tensor_type(), &x.tensor_type(), &y.tensor_type())?;
    let c = broadcast(&c.to_bool(), &out.shape)?;
    if out.dtype.is_float() {
        let (x, y) = (broadcast(&x.to_f64(), &out.shape)?, broadcast(&y.to_f64(), &out.shape)?);
        let v = Zip::from(&c).and(&x).and(&y).map_collect(|&c, &x, &y| if c { x } else { y });
        return Ok(Tensor::from_f64(v, out.dtype));
    }
    let (x, y) = (broadcast(&x.to_i64(), &out.shape)?, broadcast(&y.to_i64(), &out.shape)?);
    let v = Zip::from(&c).and(&x).and(&y).map_collect(|&c, &x, &y| if c { x } else { y });
    Ok(Tensor::from_i64(v, out.dtype))
}

pub fn eval_clip(x: &Tensor, min: f64, max: f64) -> Tensor {
    if x.dtype().is_int() {
        let (lo, hi) = (min.max(i64::MIN as f64) as i64, max.min(i64::MAX as f64) as i64);
        return Tensor::from_i64(x.to_i64().mapv(|v| v.clamp(lo, hi)), x.dtype());
    }
    Tensor::from_f64(x.to_f64().mapv(|v| v.max(min).min(max)), x.dtype())
}

/// The error function (FreeBSD msun's, through `libm`: within an ulp or so).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Python's math.erf.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-1.5, -0.966_105_146_475_310_7),
            (2.4, 0.999_311_486_103_355),
            (2.6, 0.999_763_965_583_470_7),
            (4.0, 0.999_999_984_582_742_1),
            (f64::INFINITY, 1.0),
            (f64::NEG_INFINITY, -1.0),
        ] {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {} want {want}", erf(x));
        }
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 1, 4], &[3, 1]).unwrap(), vec![2, 3, 4]);
        assert_eq!(broadcast_shapes(&[], &[5]).unwrap(), vec![5]);
        assert!(broadcast_shapes(&[2, 3], &[4, 3]).is_err());
    }
}
