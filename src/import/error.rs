//! Import errors. Each names the file, and where one node is at fault its name, `op_type` and
//! the model's opset.

use std::path::PathBuf;

use thiserror::Error;

use crate::ir::IrError;

/// Why an ONNX file could not be imported.
#[derive(Debug, Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("{path}: cannot read the file: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("{path}: the file is empty, not an ONNX model")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The bytes are not an ONNX ModelProto.
    #[error("{path}: not a valid ONNX model (protobuf decoding failed: {message}); is the file truncated or of another format?")]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The model has no graph.
    #[error("{path}: the ONNX model has no graph")]
    NoGraph {
        /// The file.
        path: PathBuf,
    },
    /// Nodes of ops fusec does not import.
    #[error("{path}: {count} unsupported op(s): {list}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// How many.
        count: usize,
        /// Each, named.
        list: String,
    },
    /// One node cannot be imported.
    #[error("{path}: node '{node}' ({op_type}, opset {opset}): {message}")]
    Node {
        /// The file.
        path: PathBuf,
        /// The ONNX node's name.
        node: String,
        /// The node's op_type.
        op_type: String,
        /// The model's opset (default domain).
        opset: i64,
        /// What is wrong.
        message: String,
    },
    /// An initializer cannot be read (its data, its size, its external location).
    #[error("{path}: initializer '{name}': {message}")]
    Initializer {
        /// The file.
        path: PathBuf,
        /// Its name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// An input dimension is symbolic and no size was given for it.
    #[error("{path}: input '{input}' dimension {axis} is symbolic ('{symbol}'): give it with --dim {symbol}=N or --input {input}:SHAPE{missing}")]
    SymbolicDim {
        /// The file.
        path: PathBuf,
        /// The input's name.
        input: String,
        /// The dimension's position.
        axis: usize,
        /// The symbolic dimension's name.
        symbol: String,
        /// The other symbols still to give, if any.
        missing: String,
    },
    /// `--input` names no input of the model.
    #[error("{path}: --input names '{name}', but the model's inputs are: {available}{suggestion}")]
    UnknownInput {
        /// The file.
        path: PathBuf,
        /// Its name.
        name: String,
        /// What there is to choose from.
        available: String,
        /// The closest name, when one is close.
        suggestion: String,
    },
    #[error(
        "{path}: --dim {symbol} matches no symbolic dimension of the model's inputs (they have: {available}){suggestion}"
    )]
    /// `--dim` names no symbolic dimension of the model.
    UnknownDim {
        /// The file.
        path: PathBuf,
        /// The symbolic dimension's name.
        symbol: String,
        /// What there is to choose from.
        available: String,
        /// The closest name, when one is close.
        suggestion: String,
    },
    /// An input's given shape does not fit the model, or is too large.
    #[error("{path}: input '{input}': {message}")]
    InputShape {
        /// The file.
        path: PathBuf,
        /// The input's name.
        input: String,
        /// What is wrong.
        message: String,
    },
    /// A graph output no node produces.
    #[error("{path}: graph output '{name}' is not produced by any node")]
    MissingOutput {
        /// The file.
        path: PathBuf,
        /// Its name.
        name: String,
    },
    /// The graph built from the file is not valid.
    #[error("{path}: {source}")]
    Ir {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: IrError,
    },
}
