//! Running a bundle on a GPU: the `Session`, its options, and `run`. Each concept of a
//! session has a room of its own: loading a bundle (`load`), the sizes of its ranges
//! (`sizes`), staging inputs and outputs (`io`), inputs and outputs in the caller's memory
//! (`external`), running the steps and capturing them as a
//! CUDA graph (`graph`), launching a step (`launch`), choosing GEMM algorithms by timing
//! (`tuning`), timing steps and runs (`profile`), state kept between runs (`state`),
//! drawing tokens from rows of logits (`sample`) and greedy tokens fed back on the device
//! (`feed`).
//!
//! Thread safety: a `Session` owns its stream, arena and cuBLAS handle; `run` takes
//! `&mut self`, so one session serves one thread at a time. Use one session per thread to run
//! concurrently (each has its own memory).
//!
//! CUDA graphs: the first `run` executes the steps one by one; it then captures them into a
//! CUDA graph, and every later run replays that graph with one launch (unless turned off).

mod columns;
mod external;
mod faults;
mod feed;
mod graph;
mod io;
mod launch;
mod load;
mod pinned;
mod profile;
mod programmatic;
pub use programmatic::tuning_ones;
mod sample;
mod sizes;
mod state;
mod tuning;

use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, PinnedHostSlice};

use super::lt::GemmChoice;
use super::{blas, lt, RuntimeError};
use crate::bundle::{Bundle, IoSpec};
use crate::ir::{DType, Tensor};
use launch::Loaded;

pub use columns::{CacheCopy, ColumnSet};
pub use external::{DeviceInput, DeviceOutput, HostInput};
pub use pinned::{PinnedOutput, PINNED_MIN_BYTES};
pub use profile::{StepProfile, TimingEvent, PROFILE_REPEAT};
pub use programmatic::LaunchChoice;
pub use sample::{RowDraw, SampledRows};
pub use state::RowCopy;

pub(super) fn driver(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Driver(format!("{e:?}"))
}

/// The CUDA version the driver supports (major, minor), or `None` where there is no driver.
pub fn driver_version() -> Option<(i32, i32)> {
    if !driver_available() {
        return None;
    }
    let mut version = 0;
    // SAFETY: writes one int; the library was just found to load.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some((version / 1000, version % 1000 / 10))
}

/// Whether a CUDA driver can be loaded, without panicking when there is none.
pub fn driver_available() -> bool {
    super::library_present(super::Library::Driver, cudarc::driver::sys::is_culib_present)
}

/// A bundle loaded on one GPU: its kernels, weights, activation memory and stream, ready to
/// run. `run` takes `&mut self`; make one session per thread to run on several at once.
pub struct Session {
    stream: Arc<CudaStream>,
    blas: blas::Blas,
    /// Declared after `steps` would be dropped before them: steps hold cuBLASLt descriptors.
    steps: Vec<Loaded>,
    lt: Option<lt::Lt>,
    arena: CudaSlice<u8>,
    _weights: CudaSlice<u8>,
    arena_ptr: u64,
    weights_ptr: u64,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    use_graph: bool,
    graph: Option<CudaGraph>,
    runs: usize,
    /// The bundle's ranges of sizes (none for a bundle of one size).
    ranges: Vec<crate::bundle::BundleRange>,
    /// The point of the ranges `steps` and `graph` are for (the top of every range at first;
    /// empty without ranges).
    point: Vec<usize>,
    /// The steps and graph of other points run lately (the top's always), most recent last.
    sizes: Vec<(Vec<usize>, Vec<Loaded>, Option<CudaGraph>)>,
    /// How many sizes keep their steps and graph, the top's included.
    sizes_kept: usize,
    /// Whether GEMM algorithms are chosen by timing ([`SessionOptions::tune_gemms`]).
    tune: bool,
    /// Runs at the current point since it was selected, and whether its GEMMs were timed.
    point_runs: usize,
    point_tuned: bool,
    /// Points whose GEMMs were timed in this session.
    tuned: Vec<Vec<usize>>,
    /// The arch kernels were compiled for (`sm_90`).
    pub arch: String,
    /// The GPU's name as the driver reports it.
    pub device_name: String,
    /// How each distinct cuBLASLt GEMM's algorithm was chosen.
    pub gemm_choices: Vec<GemmChoice>,
    /// Whether the generated kernels are launched with programmatic dependent launch
    /// regardless of timing (`None`: chosen by timing the program at load).
    programmatic_forced: Option<bool>,
    /// How that was chosen at load, where it was timed.
    pub launch_choice: Option<LaunchChoice>,
    /// Page-locked host buffers, one per input and one per output, that `run` copies
    /// through: copies from and to them are asynchronous, so a run waits for the GPU once for
    /// all its outputs, rather than once per copy as copies of pageable memory do.
    staging_in: Vec<PinnedHostSlice<u8>>,
    staging_out: Vec<PinnedHostSlice<u8>>,
    /// cuDNN, for a bundle with convolutions, and the workspace its algorithms share.
    dnn: Option<super::dnn::Dnn>,
    conv_workspace: Option<CudaSlice<u8>>,
    /// Kernels for state kept between runs, loaded on first use.
    state: state::StateKernels,
    /// Page-locked buffers for outputs handed to the host ([`Session::output_pinned`]).
    pinned: Arc<std::sync::Mutex<pinned::Pool>>,
    /// Where the kernels report an index outside its axis (none: the bundle gathers nothing).
    faults: Option<faults::IndexFaults>,
    /// For each input, whether the load times the program with ones in it
    /// ([`Session::stage_tuning_inputs`]).
    tuning_ones: Vec<bool>,
}

/// How a session runs.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Replay the steps as one CUDA graph after the first run.
    pub cuda_graph: bool,
    /// Choose each GEMM's algorithm at load by timing the whole program (a CUDA graph) with
    /// the reference and each of the cuBLASLt heuristic's top algorithms, cached on disk;
    /// without CUDA graphs only cached choices apply. Off: GEMMs with a cuBLASLt epilogue
    /// take the heuristic's first algorithm, the others cuBLAS.
    pub tune_gemms: bool,
    /// For a bundle with a range of sizes: how many sizes keep their steps and CUDA graph
    /// (the top of the range always does); a size run again after it was dropped is set up
    /// and captured again.
    pub sizes_kept: usize,
    /// Launch the generated kernels with programmatic dependent launch (sm_90 and later):
    /// each may be scheduled while the one before it finishes. On: always (a generator's
    /// one-token steps; GPT-2 small fp16 at batch 1 on an H100: 0.418 → 0.404 ms a token).
    /// Off: where GEMMs are tuned with CUDA graphs, the program is timed both ways at load and
    /// the faster kept (ConvNeXt-T at batch 8 gains 3–7 %, the Llama-style decoder at 8×128
    /// loses 6 % with it: `benches/NOTES.md`); else off. `FUSEC_PDL=1` or `0` overrides it.
    pub programmatic_launch: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { cuda_graph: true, tune_gemms: true, sizes_kept: 8, programmatic_launch: false }
    }
}

impl Drop for Session {
    /// The CUDA graphs go first, once the stream is idle: they refer to the kernels of the
    /// session's modules and to its memory, which the fields dropped after them unload and free.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        self.graph = None;
        self.sizes.clear();
    }
}

impl Session {
    /// Fails where a kernel read an index outside its axis since the last check (naming the
    /// gather); call after waiting for the run.
    fn check_indices(&self) -> Result<(), RuntimeError> {
        self.faults.as_ref().map_or(Ok(()), faults::IndexFaults::check)
    }

    /// The convolutions' workspace: device address and bytes (0 and 0 without one).
    fn conv_workspace(&self) -> (u64, usize) {
        use cudarc::driver::DevicePtr;
        match &self.conv_workspace {
            Some(w) => (w.device_ptr(&self.stream).0, w.len()),
            None => (0, 0),
        }
    }

    /// Loads `bundle` on GPU `device`: compiles its kernels if the bundle has no PTX for this
    /// GPU, uploads the weights, allocates the arena.
    pub fn new(bundle: &Bundle, device: usize) -> Result<Session, RuntimeError> {
        Session::with_options(bundle, device, SessionOptions::default())
    }

    /// The bundle's inputs: names, element types and shapes, in order.
    pub fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }

    /// The bundle's outputs, in the order `run` returns them.
    pub fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }

    /// Runs the model on host tensors (by input name); returns the outputs in order.
    pub fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        self.upload(inputs)?;
        self.execute_all()?;
        self.download()
    }

    /// Runs the model and writes its outputs into `outputs` (in the order of
    /// [`Session::outputs`], each of that output's type and shape), allocating nothing: a
    /// serving loop keeps one set of output tensors and reuses it. `outputs` from an earlier
    /// [`Session::run`] fit.
    pub fn run_into(
        &mut self,
        inputs: &[(String, Tensor)],
        outputs: &mut [Tensor],
    ) -> Result<(), RuntimeError> {
        self.upload(inputs)?;
        self.check_outputs(outputs)?;
        self.execute_all()?;
        self.copy_out()?;
        for (staging, tensor) in self.staging_out.iter().zip(outputs.iter_mut()) {
            let bytes = tensor.size_bytes();
            let host = staging.as_slice().map_err(driver)?;
            crate::plan::read_tensor_bytes(host.get(..bytes).unwrap_or_default(), tensor);
        }
        Ok(())
    }
}

/// A tensor from little-endian element bytes ([`Tensor::from_le_bytes`]).
pub fn tensor_from_bytes(bytes: &[u8], shape: &[usize], dtype: DType) -> Result<Tensor, RuntimeError> {
    Tensor::from_le_bytes(bytes, shape, dtype).ok_or_else(|| {
        RuntimeError::Driver(format!("{} bytes are not a {dtype} tensor of shape {shape:?}", bytes.len()))
    })
}

/// Runs `bundle` once on `inputs` on GPU `device`.
pub fn run_once(
    bundle: &Bundle,
    device: usize,
    inputs: &[(String, Tensor)],
) -> Result<Vec<(String, Tensor)>, RuntimeError> {
    Session::new(bundle, device)?.run(inputs)
}
