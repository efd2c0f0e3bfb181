//! fusec compiles ONNX models into a few fused CUDA kernels plus cuBLAS calls.
//!
//! The pipeline runs one way, one module per stage:
//! [`import`] → [`ir`] → [`passes`] → [`fusion`] → [`plan`] → [`codegen`] → [`bundle`], with
//! [`runtime`] the only module that talks to the GPU.

// Input- and device-dependent paths return errors: no unwrap or expect outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[warn(missing_docs)]
pub mod bundle;
#[warn(missing_docs)]
pub mod codegen;
pub mod fusion;
#[warn(missing_docs)]
pub mod import;
pub mod ir;
mod parallel;
#[warn(missing_docs)]
pub mod passes;
#[warn(missing_docs)]
pub mod picture;
#[warn(missing_docs)]
pub mod pipeline;
#[warn(missing_docs)]
pub mod plan;
#[warn(missing_docs)]
pub mod runtime;
#[warn(missing_docs)]
pub mod suggest;
#[warn(missing_docs)]
pub mod tensor_io;

pub use bundle::Bundle;
pub use pipeline::{compile, compile_reporting, CompileOptions};
pub use runtime::Session;
