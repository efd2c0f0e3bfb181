//! fusec compiles ONNX models into a few fused CUDA kernels plus cuBLAS calls.
//!
//! The pipeline runs one way: [`import`] → [`ir`] → [`passes`] → fusion → plan → codegen →
//! bundle, with the runtime the only part that talks to the GPU.

pub mod import;
pub mod ir;
pub mod passes;
