//! Errors of the IR: type errors, verifier failures, evaluation failures. Each names the node.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum IrError {
    #[error("node '{node}' ({op}): {message}")]
    Op { node: String, op: String, message: String },
    #[error("the graph has a cycle through node '{node}'")]
    Cycle { node: String },
    #[error("verifier: node '{node}': {message}")]
    Verify { node: String, message: String },
    #[error("input '{name}' was not given (the graph's inputs: {expected})")]
    MissingInput { name: String, expected: String },
    #[error("input '{name}' has type {got}, the graph expects {expected}")]
    InputType { name: String, expected: String, got: String },
    #[error("'{name}' is not an input of the graph (its inputs: {expected})")]
    UnknownInput { name: String, expected: String },
}
