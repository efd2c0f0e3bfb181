//! Element types a tensor of the IR can hold.

use std::fmt;

/// The element type of a tensor. Floating-point math in the reference evaluator runs in f64
/// and rounds to the node's type after every op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
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

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }

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

/// The static type of a value: element type and concrete shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        TensorType { dtype, shape }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype.size_bytes()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(","))
    }
}
