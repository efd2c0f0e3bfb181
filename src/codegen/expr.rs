//! C spellings of element types, literals and pointwise ops.

use crate::ir::{BinaryOp, DType, UnaryOp};

/// The C type an element type is stored as in memory.
pub fn c_type(dtype: DType) -> Result<&'static str, String> {
    match dtype {
        DType::F32 => Ok("float"),
        DType::F16 => Ok("__half"),
        DType::BF16 => Ok("__nv_bfloat16"),
        DType::I64 => Ok("long long"),
        DType::I32 => Ok("int"),
        DType::Bool => Ok("bool"),
        other => Err(format!(
            "{other} tensors are not supported by the generated kernels yet (f32, f16, bf16, i64, i32, bool are)"
        )),
    }
}

/// The C type a value has in registers: half types compute in f32.
pub fn register_type(dtype: DType) -> Result<&'static str, String> {
    match dtype {
        DType::F16 | DType::BF16 => Ok("float"),
        other => c_type(other),
    }
}

/// A stored element, widened to its register type.
pub fn load(element: &str, dtype: DType) -> String {
    match dtype {
        DType::F16 => format!("__half2float({element})"),
        DType::BF16 => format!("__bfloat162float({element})"),
        _ => element.to_string(),
    }
}

/// A register value, narrowed to its stored type.
pub fn narrow(value: &str, dtype: DType) -> String {
    match dtype {
        DType::F16 => format!("__float2half_rn({value})"),
        DType::BF16 => format!("__float2bfloat16_rn({value})"),
        _ => value.to_string(),
    }
}

/// The header a kernel touching `dtype` needs.
pub fn header(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F16 => Some("#include <cuda_fp16.h>"),
        DType::BF16 => Some("#include <cuda_bf16.h>"),
        _ => None,
    }
}

/// A literal of `dtype` for `value`; infinities and NaN through bit patterns (NVRTC has no
/// math headers).
pub fn literal(value: f64, dtype: DType) -> String {
    match dtype {
        DType::Bool => (if value != 0.0 { "true" } else { "false" }).into(),
        d if d.is_int() => format!("{}LL", value as i64),
        _ if value.is_nan() => "fusec::nan()".into(),
        _ if value == f64::INFINITY => "fusec::inf()".into(),
        _ if value == f64::NEG_INFINITY => "(-fusec::inf())".into(),
        _ => format!("{:e}f", value as f32),
    }
}

pub fn unary(op: UnaryOp, x: &str, dtype: DType) -> String {
    let float = dtype.is_float();
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs if float => format!("fabsf({x})"),
        UnaryOp::Abs => format!("({x} < 0 ? -{x} : {x})"),
        UnaryOp::Sqrt => format!("sqrtf({x})"),
        UnaryOp::Reciprocal => format!("(1.0f / {x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Erf => format!("erff({x})"),
        UnaryOp::Tanh => format!("tanhf({x})"),
        UnaryOp::Sigmoid => format!("fusec::sigmoid({x})"),
        UnaryOp::Relu => format!("fusec::relu({x})"),
        UnaryOp::Sin => format!("sinf({x})"),
        UnaryOp::Cos => format!("cosf({x})"),
        UnaryOp::Not => format!("(!{x})"),
        UnaryOp::IsNaN => format!("({x} != {x})"),
        UnaryOp::NanToZero => format!("({x} != {x} ? 0.0f : {x})"),
        UnaryOp::Gelu => format!("fusec::gelu({x})"),
        UnaryOp::GeluTanh => format!("fusec::gelu_tanh({x})"),
    }
}

/// `op` on operands of element type `dtype` (the inputs' type, not the result's).
pub fn binary(op: BinaryOp, a: &str, b: &str, dtype: DType) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Pow if dtype.is_float() => format!("powf({a}, (float)({b}))"),
        BinaryOp::Pow => format!("(long long)powf((float)({a}), (float)({b}))"),
        BinaryOp::Mod if dtype.is_float() => format!("fusec::floor_mod({a}, {b})"),
        BinaryOp::Mod => format!("fusec::floor_mod((long long)({a}), (long long)({b}))"),
        BinaryOp::Fmod if dtype.is_float() => format!("fmodf({a}, {b})"),
        BinaryOp::Fmod => format!("((long long)({a}) % (long long)({b}))"),
        BinaryOp::Min => format!("fusec::minimum({a}, {b})"),
        BinaryOp::Max => format!("fusec::maximum({a}, {b})"),
        BinaryOp::Equal => format!("({a} == {b})"),
        BinaryOp::Less => format!("({a} < {b})"),
        BinaryOp::LessOrEqual => format!("({a} <= {b})"),
        BinaryOp::Greater => format!("({a} > {b})"),
        BinaryOp::GreaterOrEqual => format!("({a} >= {b})"),
        // Both operands are evaluated (no branch): they are values, not guards.
        BinaryOp::And => format!("({a} & {b})"),
    }
}

/// ONNX `Cast` from `from` to `to`, on register values.
pub fn cast(x: &str, from: DType, to: DType) -> Result<String, String> {
    let target = register_type(to)?;
    Ok(match (from, to) {
        (_, DType::Bool) => format!("({x} != 0)"),
        // Rounding to a half type keeps the value in f32 registers.
        (_, DType::F16 | DType::BF16) => load(&narrow(&format!("(float)({x})"), to), to),
        _ => format!("(({target})({x}))"),
    })
}
