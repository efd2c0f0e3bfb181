//! The only module that talks to the GPU (cudarc, loaded dynamically): context, NVRTC with a
//! cache, module loading, launches, cuBLAS/cuBLASLt, CUDA-graph capture and replay, timing.
