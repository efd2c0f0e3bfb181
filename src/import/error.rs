//! Import errors. Each names the file, and where one node is at fault its name, `op_type` and
//! the model's opset.

use std::path::PathBuf;

use thiserror::Error;

use crate::ir::IrError;

#[derive(Debug, Error)]
pub enum ImportError {
    #[error("{path}: cannot read the file: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: the file is empty, not an ONNX model")]
    Empty { path: PathBuf },
    #[error("{path}: not a valid ONNX model (protobuf decoding failed: {message}); is the file truncated or of another format?")]
    Decode { path: PathBuf, message: String },
    #[error("{path}: the ONNX model has no graph")]
    NoGraph { path: PathBuf },
    #[error("{path}: {count} unsupported op(s): {list}")]
    Unsupported { path: PathBuf, count: usize, list: String },
    #[error("{path}: node '{node}' ({op_type}, opset {opset}): {message}")]
    Node { path: PathBuf, node: String, op_type: String, opset: i64, message: String },
    #[error("{path}: initializer '{name}': {message}")]
    Initializer { path: PathBuf, name: String, message: String },
    #[error("{path}: input '{input}' dimension {axis} is symbolic ('{symbol}'): give it with --dim {symbol}=N or --input {input}:SHAPE{missing}")]
    SymbolicDim { path: PathBuf, input: String, axis: usize, symbol: String, missing: String },
    #[error("{path}: --input names '{name}', but the model's inputs are: {available}{suggestion}")]
    UnknownInput { path: PathBuf, name: String, available: String, suggestion: String },
    #[error(
        "{path}: --dim {symbol} matches no symbolic dimension of the model's inputs (they have: {available}){suggestion}"
    )]
    UnknownDim { path: PathBuf, symbol: String, available: String, suggestion: String },
    #[error("{path}: input '{input}': {message}")]
    InputShape { path: PathBuf, input: String, message: String },
    #[error("{path}: graph output '{name}' is not produced by any node")]
    MissingOutput { path: PathBuf, name: String },
    #[error("{path}: {source}")]
    Ir { path: PathBuf, source: IrError },
}
