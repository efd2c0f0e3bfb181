//! The execution plan: ordered steps (fused kernel, cuBLAS(Lt) GEMM, copy), buffer liveness
//! and one arena with offsets, the weights layout. Knows nothing of cudarc.
