//! The only module that talks to the GPU (cudarc, libraries loaded at run time): NVRTC,
//! module loading, launches, cuBLAS, timing. A missing library or GPU is an error value,
//! never a panic: presence is checked before cudarc is asked to load anything.

mod blas;
mod dnn;
mod lt;
mod rates;
mod session;

pub use lt::{
    candidates_wanted as gemm_candidates, variants_wanted as gemm_variants, GemmChoice,
    Reference as GemmReference, CANDIDATES as GEMM_CANDIDATES,
};
pub use rates::{measure as measure_rates, DeviceRates};
pub use session::{
    driver_available, driver_version, run_once, tensor_from_bytes, tuning_ones, CacheCopy, ColumnSet,
    DeviceInput, DeviceOutput, HostInput, PinnedOutput, RowCopy, RowDraw, SampledRows, Session,
    SessionOptions, StepProfile, TimingEvent, PINNED_MIN_BYTES, PROFILE_REPEAT,
};

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::CudaContext;
use thiserror::Error;

/// The context of GPU `device`, one for the whole process, shared by every session and
/// measurement on it (with cudarc's per-buffer events off: each user works in stream order
/// on its own stream). Holding it for the process keeps the device's primary context — and
/// the driver's state attached to it — alive between sessions, rather than torn down and
/// made again whenever the last session of the moment is dropped. (cuBLAS and cuBLASLt
/// handles are kept for the process the same way, in `blas` and `lt`: destroying them while
/// other threads worked crashed the process, `tests/RELIABILITY.md`.)
pub(crate) fn context(device: usize) -> Result<Arc<CudaContext>, RuntimeError> {
    static CONTEXTS: Mutex<Vec<(usize, Arc<CudaContext>)>> = Mutex::new(Vec::new());
    let mut contexts = CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, ctx)) = contexts.iter().find(|(d, _)| *d == device) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(device).map_err(|e| RuntimeError::NoDevice(format!("GPU {device}: {e:?}")))?;
    // SAFETY: every user of the context (a session, the rate measurement) uses one stream
    // of its own and writes and reads every buffer in stream order, so cudarc's per-buffer
    // events are not needed (they would also get in the way of CUDA-graph capture).
    unsafe { ctx.disable_event_tracking() };
    contexts.push((device, ctx.clone()));
    Ok(ctx)
}

/// Things kept for the life of the process, per device, and lent to one user at a time
/// (cuBLAS and cuBLASLt handles: see `blas::Blas`).
pub(crate) struct DevicePool<T>(Mutex<Vec<(usize, T)>>);

impl<T> DevicePool<T> {
    pub(crate) const fn new() -> Self {
        DevicePool(Mutex::new(Vec::new()))
    }

    /// One of `device`'s, if the pool holds one.
    pub(crate) fn take(&self, device: usize) -> Option<T> {
        let mut pool = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        pool.iter().position(|(d, _)| *d == device).map(|i| pool.swap_remove(i).1)
    }

    /// Gives `item` of `device` back.
    pub(crate) fn give(&self, device: usize, item: T) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((device, item));
    }
}

/// Whether the library `check` looks for can be loaded, asked once per process and `key`:
/// cudarc's check opens and closes the library each time, and a library opened and closed on
/// one thread while another starts using it is churn the loader need not see on every
/// session.
pub(crate) fn library_present(key: Library, check: unsafe fn() -> bool) -> bool {
    static FOUND: Mutex<Vec<(Library, bool)>> = Mutex::new(Vec::new());
    let mut found = FOUND.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, present)) = found.iter().find(|(k, _)| *k == key) {
        return *present;
    }
    // SAFETY: cudarc's presence checks only try to dlopen the library; no call is made.
    let present = unsafe { check() };
    found.push((key, present));
    present
}

/// The libraries the runtime loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Library {
    Driver,
    Cublas,
    Cudnn,
    CublasLt,
}

/// Free and total bytes of GPU `device`'s memory, as the driver reports them.
pub fn device_memory(device: usize) -> Result<(usize, usize), RuntimeError> {
    if !session::driver_available() {
        return Err(RuntimeError::NoDriver);
    }
    context(device)?.mem_get_info().map_err(|e| RuntimeError::Driver(format!("{e:?}")))
}

/// What can go wrong loading or running a bundle on a GPU. Each message names what it is
/// about (the kernel, the input, the library) and, where there is one, what to do.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// libcuda could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: libcuda.so was not found (is this a machine with an NVIDIA GPU and driver?)")]
    NoDriver,
    /// libcudnn could not be loaded (a bundle with convolutions needs it).
    #[error("cuDNN is not available: libcudnn.so.9 was not found (install cuDNN 9 for CUDA 13, e.g. the nvidia-cudnn-cu13 wheel or the distribution's libcudnn9 package, and add its lib/ to LD_LIBRARY_PATH)")]
    NoCudnn,
    /// libcublas could not be loaded.
    #[error("cuBLAS is not available: libcublas.so.13 was not found")]
    NoCublas,
    /// The driver is there but the GPU could not be opened (the driver's error).
    #[error("cannot open the GPU: {0}")]
    NoDevice(String),
    /// A CUDA, cuBLAS or cuBLASLt call failed (what was being done, and the error).
    #[error("CUDA: {0}")]
    Driver(String),
    /// The inputs given do not fit the bundle (names the input and what it expected).
    #[error("{0}")]
    Input(String),
    /// A kernel read an index outside its axis (a gather's, names the node, the indices and
    /// the axis): the run's outputs are not valid; the session can run again.
    #[error("index out of range: {0}; the run's outputs are not valid")]
    IndexOutOfRange(String),
    /// An allocation found the GPU's memory full.
    #[error("out of GPU memory on {device}: {what} needs {needed} bytes and {free} of {total} are free (drop other sessions, or compile for a smaller shape)")]
    OutOfMemory {
        /// The GPU's name.
        device: String,
        /// What was being allocated (the activation arena, the weights).
        what: String,
        /// Bytes asked for.
        needed: usize,
        /// Bytes the driver reported free then.
        free: usize,
        /// The GPU's memory in bytes.
        total: usize,
    },
    /// NVRTC could not compile a kernel the bundle has no PTX for.
    #[error(transparent)]
    Nvrtc(#[from] crate::nvrtc::NvrtcError),
}
