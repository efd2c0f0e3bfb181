//! Element types a tensor of the IR can hold.

use std::fmt;

/// The element type of a tensor. Floating-point math in the reference evaluator runs in f64
/// and rounds to the node's type after every op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit float (IEEE half).
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit float.
    F64,
    /// 64-bit integer.
    I64,
    /// 32-bit integer.
    I32,
    /// Boolean (one byte).
    Bool,
}

impl DType {
    /// The `TensorProto.DataType` code ONNX uses for this type.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::BF16 => 16,
        }
    }

    /// The type for an ONNX `TensorProto.DataType` code, if the IR supports it.
    pub fn from_onnx_code(code: i64) -> Option<DType> {
        [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32, DType::Bool]
            .into_iter()
            .find(|d| i64::from(d.onnx_code()) == code)
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// Whether it is an integer type.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }

    /// Its short name (`f32`, `bf16`, `i64`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Parses the short names used on the command line (`f32`, `i64`, …).
    pub fn from_name(name: &str) -> Option<DType> {
        [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32, DType::Bool]
            .into_iter()
            .find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The number of elements of `shape`, `None` where it overflows (shapes a file declares).
pub fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// The static type of a value: element type and concrete shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// The element type.
    pub dtype: DType,
    /// The shape.
    pub shape: Vec<usize>,
}

impl TensorType {
    /// A type of `dtype` elements in `shape`.
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        TensorType { dtype, shape }
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its elements.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype.size_bytes()
    }

    /// [`TensorType::size_bytes`], `None` where it overflows.
    pub fn checked_size_bytes(&self) -> Option<usize> {
        element_count(&self.shape)?.checked_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(","))
    }
}
