//! fusec compiles ONNX models into a few fused CUDA kernels plus cuBLAS calls.
//!
//! The pipeline runs one way, one module per stage:
//! [`import`] → [`ir`] → [`passes`] → [`fusion`] → [`plan`] → [`codegen`] → [`bundle`], with
//! [`runtime`] the only module that talks to the GPU.

// Input- and device-dependent paths return errors: no unwrap or expect outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Every public item is documented (`cargo doc` has nothing to warn about).
#![warn(missing_docs)]

pub mod bundle;
pub mod checksum;
pub mod codegen;
pub mod error_chain;
pub mod fusion;
pub mod generate;
pub mod import;
pub mod ir;
mod knobs;
pub mod nvrtc;
mod parallel;
pub mod passes;
pub mod picture;
pub mod pipeline;
pub mod plan;
pub mod runtime;
pub mod suggest;
pub mod tensor_io;

pub use bundle::Bundle;
pub use generate::Generator;
pub use pipeline::{compile, compile_reporting, CompileOptions};
pub use runtime::Session;
