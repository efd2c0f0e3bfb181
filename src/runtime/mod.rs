//! The only module that talks to the GPU (cudarc, libraries loaded at run time): NVRTC,
//! module loading, launches, cuBLAS, timing. A missing library or GPU is an error value,
//! never a panic: presence is checked before cudarc is asked to load anything.

mod blas;
mod lt;
pub mod nvrtc;
mod rates;
mod session;

pub use lt::{
    candidates_wanted as gemm_candidates, variants_wanted as gemm_variants, GemmChoice,
    Reference as GemmReference, CANDIDATES as GEMM_CANDIDATES,
};
pub use rates::{measure as measure_rates, DeviceRates};
pub use session::{
    driver_available, driver_version, run_once, tensor_from_bytes, Session, SessionOptions, StepProfile,
    PROFILE_REPEAT,
};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("NVRTC is not available: libnvrtc.so.13 was not found (install CUDA 13 or the nvidia-cuda-nvrtc wheel and add its lib/ to LD_LIBRARY_PATH)")]
    NoNvrtc,
    #[error("no CUDA driver: libcuda.so was not found (is this a machine with an NVIDIA GPU and driver?)")]
    NoDriver,
    #[error("cuBLAS is not available: libcublas.so.13 was not found")]
    NoCublas,
    #[error("cannot open the GPU: {0}")]
    NoDevice(String),
    #[error("CUDA: {0}")]
    Driver(String),
    #[error("{0}")]
    Input(String),
    #[error("kernel {kernel} includes {header}, but no CUDA include directory has it: set FUSEC_CUDA_INCLUDE to one (e.g. /usr/local/cuda/include, or the include/ of the nvidia-cuda-runtime wheel), or CUDA_HOME")]
    NoCudaHeaders { kernel: String, header: String },
    #[error("NVRTC failed on kernel {kernel} (source written to {source_path}):\n{log}")]
    Compile { kernel: String, source_path: String, log: String },
}
