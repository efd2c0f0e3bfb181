//! The only module that talks to the GPU (cudarc, libraries loaded at run time): NVRTC,
//! module loading, launches, cuBLAS, timing. A missing library or GPU is an error value,
//! never a panic: presence is checked before cudarc is asked to load anything.

pub mod nvrtc;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("NVRTC is not available: libnvrtc.so.13 was not found (install CUDA 13 or the nvidia-cuda-nvrtc wheel and add its lib/ to LD_LIBRARY_PATH)")]
    NoNvrtc,
    #[error("NVRTC failed on kernel {kernel} (source written to {source_path}):\n{log}")]
    Compile { kernel: String, source_path: String, log: String },
}
