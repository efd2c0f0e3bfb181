//! Errors of the IR: type errors, verifier failures, evaluation failures. Each names the node.

use thiserror::Error;

/// What went wrong in the IR, naming the node or input.
#[derive(Debug, Error)]
pub enum IrError {
    /// An op that cannot take its inputs, or failed evaluating.
    #[error("node '{node}' ({op}): {message}")]
    Op {
        /// The ONNX node's name.
        node: String,
        /// The op.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// The graph is not acyclic.
    #[error("the graph has a cycle through node '{node}'")]
    Cycle {
        /// The ONNX node's name.
        node: String,
    },
    /// The verifier rejected a node.
    #[error("verifier: node '{node}': {message}")]
    Verify {
        /// The ONNX node's name.
        node: String,
        /// What is wrong.
        message: String,
    },
    /// An input the evaluator was not given.
    #[error("input '{name}' was not given (the graph's inputs: {expected})")]
    MissingInput {
        /// Its name.
        name: String,
        /// What was expected.
        expected: String,
    },
    /// An input given with another type or shape.
    #[error("input '{name}' has type {got}, the graph expects {expected}")]
    InputType {
        /// Its name.
        name: String,
        /// What was expected.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A value given for no input of the graph.
    #[error("'{name}' is not an input of the graph (its inputs: {expected})")]
    UnknownInput {
        /// Its name.
        name: String,
        /// What was expected.
        expected: String,
    },
}
