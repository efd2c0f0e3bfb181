//! cuBLASLt GEMMs, with the bias (and ReLU / tanh-GELU) epilogue run inside the GEMM kernel
//! where the plan asks for one.
//!
//! Everything a call needs (descriptors, layouts, the algorithm) is chosen once when the
//! session loads; a run only calls `cublasLtMatmul`, so it can be captured into a CUDA graph.
//! The algorithm can be chosen by measurement (the session times its whole program with
//! each of the heuristic's first [`CANDIDATES`] algorithms, see `Session`); the choices go
//! into a cache file beside the NVRTC cache (keyed by GPU, cuBLASLt version and GEMM), so a
//! later session of the same shapes times nothing.
//! Same row-major trick as the cuBLAS path: `Cᵀ = Bᵀ·Aᵀ`, so cuBLASLt's A is our B, the
//! result has N rows in column-major terms, and the bias (N elements) runs along them.

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

mod cache;

pub(super) use cache::{gemm_key, AlgoCache, CachedAlgo, TUNING};

use super::RuntimeError;
use crate::codegen::{GemmSpec, LtActivation};
use crate::ir::DType;

/// cuBLASLt's recommended workspace on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// How many of the heuristic's algorithms are timed for each GEMM, unless
/// `FUSEC_GEMM_CANDIDATES` (1 to `MAX_CANDIDATES` (64)) says otherwise: see [`candidates_wanted`].
pub const CANDIDATES: usize = 8;
/// The most candidates `FUSEC_GEMM_CANDIDATES` may ask for.
pub const MAX_CANDIDATES: usize = 64;

/// How many of the heuristic's algorithms are asked for and timed for each GEMM:
/// `FUSEC_GEMM_CANDIDATES` when it is a number from 1 to `MAX_CANDIDATES` (64), else [`CANDIDATES`].
pub fn candidates_wanted() -> usize {
    count_from_env("FUSEC_GEMM_CANDIDATES", 1..=MAX_CANDIDATES, CANDIDATES)
}

/// The number in environment variable `name` when it is one within `range`, else `default`.
fn count_from_env(name: &str, range: std::ops::RangeInclusive<usize>, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| range.contains(n))
        .unwrap_or(default)
}
/// Whole-program runs timed for each candidate (median), after a capture and warm-up.
pub(super) const TIMED_RUNS: usize = 15;
/// A candidate replaces the current choice only when the program's median time drops
/// below this fraction of the current one: within it, timing noise would decide.
pub(super) const MARGIN: f64 = 0.995;
/// Names the timing method in the cache file's name, so choices timed another way (or among
/// other candidates, or against an earlier build of fusec's own kernels) are not reused.
const TIMING: &str = "program7";

/// Split-K counts tried beside each of the first [`VARIANT_BASES`] heuristic algorithms that
/// run without one: an output of few tiles (1024×768 in 128×128 tiles is 48 of the H100's 132
/// multiprocessors) leaves most of the GPU idle unless K is split.
const SPLIT_K: [u32; 3] = [2, 3, 4];
/// How many of the heuristic's algorithms get split-K and tile-shape variants.
const VARIANT_BASES: usize = 2;
/// At most this many variants are timed per GEMM, unless `FUSEC_GEMM_VARIANTS` (0 to
/// `MAX_VARIANTS`) says otherwise: see [`variants_wanted`]. None by default: on the H100,
/// across the suite's GEMMs at 1×128 and 8×128 fp16, no split-K or tile variant beat the
/// heuristic's own eight by more than timing noise (split-K ones were 10–60 % slower), and
/// timing them costs seconds at load (`benches/NOTES.md`).
pub const VARIANTS: usize = 0;
/// The most variants `FUSEC_GEMM_VARIANTS` may ask for.
pub const MAX_VARIANTS: usize = 256;

/// How many variants of the heuristic's algorithms (other split-K counts and tile shapes,
/// each checked by cuBLASLt) are timed for each GEMM: `FUSEC_GEMM_VARIANTS` when it is a
/// number from 0 to `MAX_VARIANTS`, else `VARIANTS`.
pub fn variants_wanted() -> usize {
    count_from_env("FUSEC_GEMM_VARIANTS", 0..=MAX_VARIANTS, VARIANTS)
}

fn lt_error(what: &str, e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Driver(format!("cuBLASLt {what}: {e:?}"))
}

/// A cuBLASLt handle, lent from the process's pool (see `blas::Blas` for why handles are
/// never destroyed), and the session's own workspace.
pub(super) struct Lt {
    handle: sys::cublasLtHandle_t,
    device: usize,
    workspace: CudaSlice<u8>,
    workspace_ptr: u64,
}

/// One GEMM, ready to run.
pub(super) struct LtGemm {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's algorithms, best-ranked first, then the variants of the first ones
    /// (`algo` is one of them once tuned).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
    /// How many of `candidates` the heuristic offered (the rest are variants).
    heuristic: usize,
}

/// What the timed candidates of a GEMM had to beat (candidate 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    /// The cuBLAS call (a GEMM with no epilogue cuBLASLt runs); the cuBLASLt heuristic's
    /// algorithms follow it.
    Cublas,
    /// The cuBLASLt heuristic's first algorithm.
    HeuristicFirst,
}

/// How a GEMM's algorithm was chosen, for `fusec bench` to report.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmChoice {
    /// `1024x3072x768 f16 N N +bias`: M×N×K, element type, operand layouts, epilogue.
    pub gemm: String,
    /// What the candidates had to beat.
    pub reference: Reference,
    /// How many were timed: the reference, then the heuristic's other algorithms, then the
    /// variants of its first ones (split-K counts, tile shapes).
    pub candidates: usize,
    /// How many of `candidates` came from the heuristic (the reference included); those
    /// after them are variants.
    pub heuristic: usize,
    /// Which was kept (0: the reference; with the cuBLAS reference, `n` is the heuristic's
    /// `n`-th algorithm; else its `n + 1`-th).
    pub chosen: usize,
    /// Median time of the whole program, µs, with the reference and with the kept one (the
    /// other GEMMs as chosen before this one).
    pub first_us: f64,
    /// See `first_us`.
    pub chosen_us: f64,
    /// Taken from the cache file rather than timed in this session.
    pub cached: bool,
    /// Changed when it was timed again with every other GEMM chosen (then `chosen_us` is that
    /// timing's); not kept in the cache file.
    pub revised: bool,
    /// The kept algorithm's configuration as cuBLASLt reports it (`id 66 tile 20 stages 35
    /// split-K 2 …`, cuBLASLt's enum values), or `cuBLAS`.
    pub config: String,
    /// fusec's kernel for a product of a few rows was kept (the last candidates).
    pub skinny: bool,
    /// That kernel with narrower column tiles (the last candidate where there is one).
    pub narrow: bool,
}

impl GemmChoice {
    /// Whether the GEMM stays on cuBLAS.
    pub fn cublas(&self) -> bool {
        self.reference == Reference::Cublas && self.chosen == 0 && !self.skinny
    }
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // SAFETY: created by `Lt::prepare` and destroyed only here.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for layout in self.layouts {
                let _ = lt::destroy_matrix_layout(layout);
            }
        }
    }
}

/// A cuBLASLt handle waiting in the pool.
struct PooledHandle(sys::cublasLtHandle_t);
// SAFETY: a cuBLASLt handle may be used from any thread; the pool hands each to one user.
unsafe impl Send for PooledHandle {}

static LT_HANDLES: super::DevicePool<PooledHandle> = super::DevicePool::new();

impl Drop for Lt {
    fn drop(&mut self) {
        LT_HANDLES.give(self.device, PooledHandle(self.handle));
    }
}

impl Lt {
    /// A handle, or `None` when libcublasLt cannot be loaded.
    pub(super) fn new(device: usize, stream: &Arc<CudaStream>) -> Result<Option<Lt>, RuntimeError> {
        if !super::library_present(super::Library::CublasLt, sys::is_culib_present) {
            return Ok(None);
        }
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES).map_err(|e| lt_error("workspace", e))?;
        let workspace_ptr = workspace.device_ptr(stream).0;
        let handle = match LT_HANDLES.take(device) {
            Some(PooledHandle(handle)) => handle,
            None => lt::create_handle().map_err(|e| lt_error("handle", e))?,
        };
        Ok(Some(Lt { handle, device, workspace, workspace_ptr }))
    }

    /// Descriptors and the heuristic's candidate algorithms for `g` (one matrix product, or a
    /// batch of them with both operands strided), with its epilogue when it has one (the bias at `bias`); `None` when cuBLASLt
    /// offers no algorithm (the caller then runs cuBLAS and the epilogue kernel).
    pub(super) fn prepare(&self, g: &GemmSpec, bias: Option<u64>) -> Option<LtGemm> {
        self.prepare_with(g, bias, candidates_wanted(), variants_wanted())
    }

    /// [`Lt::prepare`] with the heuristic's first algorithm only: no candidates to time (a
    /// size of a range set up on its first run, where the time to set up counts).
    pub(super) fn prepare_first(&self, g: &GemmSpec, bias: Option<u64>) -> Option<LtGemm> {
        self.prepare_with(g, bias, 1, 0)
    }

    fn prepare_with(
        &self,
        g: &GemmSpec,
        bias: Option<u64>,
        wanted: usize,
        variants: usize,
    ) -> Option<LtGemm> {
        // A batch where cuBLASLt runs the epilogue, both operands strided (a shared operand's
        // GEMM folds its batch into M); plain batches stay on cuBLAS.
        if g.batch != 1 && (g.lt_epilogue.is_none() || g.a.batch_stride == 0 || g.b.batch_stride == 0) {
            return None;
        }
        let type_of = |dtype: DType| match dtype {
            DType::F32 => Some(sys::cudaDataType_t::CUDA_R_32F),
            DType::F16 => Some(sys::cudaDataType_t::CUDA_R_16F),
            DType::BF16 => Some(sys::cudaDataType_t::CUDA_R_16BF),
            _ => None,
        };
        // C (and D) in their own type: f32 where the product is stored widened.
        let (ty, c_ty) = (type_of(g.dtype)?, type_of(g.c_dtype())?);
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        // cuBLASLt's A is our B (N×K column-major when not transposed), its B our A.
        let a = if g.b.transposed { (k, n, k) } else { (n, k, n) };
        let b = if g.a.transposed { (m, k, m) } else { (k, m, k) };
        let layout =
            |ty, (rows, cols, ld): (u64, u64, u64)| lt::create_matrix_layout(ty, rows, cols, ld as i64).ok();
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .ok()?;
        let mut gemm = LtGemm {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
            candidates: Vec::new(),
            heuristic: 0,
        };
        gemm.layouts = [layout(ty, a)?, layout(ty, b)?, layout(c_ty, (n, m, n))?];
        if g.batch != 1 {
            let count = i32::try_from(g.batch).ok()?;
            let strides = [g.b.batch_stride, g.a.batch_stride, g.m * g.n].map(|s| s as i64);
            use sys::cublasLtMatrixLayoutAttribute_t as Layout;
            for (layout, stride) in gemm.layouts.iter().zip(strides) {
                // SAFETY: the layouts are live; the attributes take an int32 and an int64.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        *layout,
                        Layout::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count as *const i32).cast(),
                        size_of::<i32>(),
                    )
                    .ok()?;
                    lt::set_matrix_layout_attribute(
                        *layout,
                        Layout::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride as *const i64).cast(),
                        size_of::<i64>(),
                    )
                    .ok()?;
                }
            }
        }
        use sys::cublasLtEpilogue_t as Code;
        let activation = g.lt_epilogue.map_or(LtActivation::None, |e| e.activation);
        let code = match (activation, bias.is_some()) {
            (LtActivation::None, false) => Code::CUBLASLT_EPILOGUE_DEFAULT,
            (LtActivation::None, true) => Code::CUBLASLT_EPILOGUE_BIAS,
            (LtActivation::Relu, false) => Code::CUBLASLT_EPILOGUE_RELU,
            (LtActivation::Relu, true) => Code::CUBLASLT_EPILOGUE_RELU_BIAS,
            (LtActivation::GeluTanh, false) => Code::CUBLASLT_EPILOGUE_GELU,
            (LtActivation::GeluTanh, true) => Code::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        if g.lt_epilogue.and_then(|e| e.bias).is_some() != bias.is_some() {
            return None;
        }
        let (trans_a, trans_b) = (i32::from(g.b.transposed), i32::from(g.a.transposed));
        use sys::cublasLtMatmulDescAttributes_t as Attr;
        let set = |attr: Attr, value: *const c_void, size: usize| {
            // SAFETY: `value` points at `size` bytes of the type the attribute takes.
            unsafe { lt::set_matmul_desc_attribute(gemm.desc, attr, value, size) }.ok()
        };
        set(Attr::CUBLASLT_MATMUL_DESC_TRANSA, (&trans_a as *const i32).cast(), size_of::<i32>())?;
        set(Attr::CUBLASLT_MATMUL_DESC_TRANSB, (&trans_b as *const i32).cast(), size_of::<i32>())?;
        set(
            Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
            (&code as *const sys::cublasLtEpilogue_t).cast(),
            size_of::<u32>(),
        )?;
        if let Some(bias) = &bias {
            set(Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, (bias as *const u64).cast(), size_of::<u64>())?;
        }
        let pref = lt::create_matmul_pref().ok()?;
        let size = WORKSPACE_BYTES;
        // SAFETY: the zeroed results are plain C structs the call fills in.
        let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; wanted.max(1)];
        let mut found = 0i32;
        // SAFETY: the attribute takes a size_t; every descriptor is live; `results` has room
        // for the `results.len()` results asked for.
        let status = unsafe {
            let ok = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&size as *const usize).cast(),
                size_of::<usize>(),
            );
            let status = match ok {
                Ok(()) => sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    gemm.desc,
                    gemm.layouts[0],
                    gemm.layouts[1],
                    gemm.layouts[2],
                    gemm.layouts[2],
                    pref,
                    results.len() as i32,
                    results.as_mut_ptr(),
                    &mut found,
                ),
                Err(_) => sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
            };
            let _ = lt::destroy_matmul_pref(pref);
            status
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return None;
        }
        gemm.candidates = results
            .iter()
            .take(usize::try_from(found).unwrap_or(0))
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= size)
            .map(|r| r.algo)
            .collect();
        gemm.algo = *gemm.candidates.first()?;
        gemm.heuristic = gemm.candidates.len();
        if variants > 0 {
            let variants = self.variants(&gemm, variants);
            gemm.candidates.extend(variants);
        }
        Some(gemm)
    }

    /// Up to `wanted` variants of the heuristic's first [`VARIANT_BASES`] algorithms that
    /// cuBLASLt accepts for `gemm` and that are not already candidates: each with K split
    /// [`SPLIT_K`] ways (where it runs unsplit and can split), then each with the other tile
    /// shapes it supports.
    fn variants(&self, gemm: &LtGemm, wanted: usize) -> Vec<sys::cublasLtMatmulAlgo_t> {
        let mut found: Vec<sys::cublasLtMatmulAlgo_t> = Vec::new();
        let bases: Vec<_> = gemm.candidates.iter().take(VARIANT_BASES).copied().collect();
        let offer = |algo: sys::cublasLtMatmulAlgo_t, found: &mut Vec<sys::cublasLtMatmulAlgo_t>| {
            let known = gemm.candidates.iter().chain(found.iter()).any(|c| c.data == algo.data);
            if found.len() < wanted && !known && self.check(gemm, &algo) {
                found.push(algo);
            }
        };
        for base in &bases {
            let unsplit = config::<u32>(base, Config::CUBLASLT_ALGO_CONFIG_SPLITK_NUM).unwrap_or(1) <= 1;
            let splits = capability::<i32>(base, Cap::CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) == Some(1);
            let schemes = capability::<u32>(base, Cap::CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK).unwrap_or(0);
            // A reduction in f32 where the algorithm offers one, else in the output type, else in place.
            let scheme = [
                Reduction::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                Reduction::CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE,
                Reduction::CUBLASLT_REDUCTION_SCHEME_INPLACE,
            ]
            .into_iter()
            .find(|s| schemes & (*s as u32) != 0);
            if let (true, true, Some(scheme)) = (unsplit, splits, scheme) {
                for k in SPLIT_K {
                    let mut algo = *base;
                    if set_config(&mut algo, Config::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, k)
                        && set_config(&mut algo, Config::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme as u32)
                    {
                        offer(algo, &mut found);
                    }
                }
            }
        }
        for base in &bases {
            let current = config::<u32>(base, Config::CUBLASLT_ALGO_CONFIG_TILE_ID);
            for tile in capability_list(base, Cap::CUBLASLT_ALGO_CAP_TILE_IDS) {
                if tile == 0 || Some(tile) == current {
                    continue;
                }
                let mut algo = *base;
                if set_config(&mut algo, Config::CUBLASLT_ALGO_CONFIG_TILE_ID, tile) {
                    offer(algo, &mut found);
                }
            }
        }
        found
    }

    /// Whether `algo` runs `gemm` (a cached choice still fits this GEMM and library).
    fn check(&self, gemm: &LtGemm, algo: &sys::cublasLtMatmulAlgo_t) -> bool {
        // SAFETY: the descriptors are live; the result is a plain C struct filled in.
        unsafe {
            let mut result: sys::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let status = sys::cublasLtMatmulAlgoCheck(
                self.handle,
                gemm.desc,
                gemm.layouts[0],
                gemm.layouts[1],
                gemm.layouts[2],
                gemm.layouts[2],
                algo,
                &mut result,
            );
            status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && result.workspaceSize <= WORKSPACE_BYTES
        }
    }

    /// How many algorithms are candidates for `gemm`: the heuristic's, then the variants.
    pub(super) fn candidates(gemm: &LtGemm) -> usize {
        gemm.candidates.len()
    }

    /// How many of `gemm`'s candidates the heuristic offered.
    pub(super) fn heuristic(gemm: &LtGemm) -> usize {
        gemm.heuristic
    }

    /// The configuration `gemm` runs with now, for reports.
    pub(super) fn config(gemm: &LtGemm) -> String {
        describe(&gemm.algo)
    }

    /// Runs `gemm` with the heuristic's `rank`-th algorithm from now on.
    pub(super) fn select(gemm: &mut LtGemm, rank: usize) {
        if let Some(&algo) = gemm.candidates.get(rank) {
            gemm.algo = algo;
        }
    }

    /// Runs `gemm` with the algorithm `like` runs (the same product, prepared again).
    pub(super) fn same_algo(gemm: &mut LtGemm, like: &LtGemm) {
        gemm.algo = like.algo;
    }

    /// Runs `gemm` with a cached algorithm if it still fits this GEMM and library.
    pub(super) fn restore(&self, gemm: &mut LtGemm, cached: &CachedAlgo) -> bool {
        let fits = self.check(gemm, &cached.algo);
        if fits {
            gemm.algo = cached.algo;
        }
        fits
    }

    /// cuBLASLt's version, part of the cache key (algorithms are valid for one version).
    pub(super) fn version() -> usize {
        // SAFETY: a plain query of the loaded library.
        unsafe { sys::cublasLtGetVersion() }
    }

    /// Issues `gemm` on `stream`: our A at `a`, B at `b`, the result written to `c`, the
    /// residual at `residual` added where the epilogue has one.
    pub(super) fn run(
        &self,
        gemm: &LtGemm,
        g: &GemmSpec,
        (a, b, c): (u64, u64, u64),
        residual: Option<u64>,
        stream: &CudaStream,
    ) -> Result<(), RuntimeError> {
        // A residual is cuBLASLt's C (β = 1), of D's layout; else C is D, unread.
        let scale = g.lt_epilogue.map_or(1.0, |e| e.scale());
        let (alpha, beta) = (g.alpha * scale, if residual.is_some() { 1.0f32 } else { 0.0 });
        let input = residual.unwrap_or(c);
        // SAFETY: the descriptors were built for these shapes; the pointers are inside the
        // session's arena and weights at offsets the plan sized; the workspace is ours.
        unsafe {
            lt::matmul(
                self.handle,
                gemm.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                b as *const c_void,
                gemm.layouts[0],
                a as *const c_void,
                gemm.layouts[1],
                input as *const c_void,
                gemm.layouts[2],
                c as *mut c_void,
                gemm.layouts[2],
                &gemm.algo,
                self.workspace_ptr as *mut c_void,
                self.workspace.len(),
                stream.cu_stream() as *mut _,
            )
        }
        .map_err(|e| lt_error("matmul", e))
    }
}

use sys::cublasLtMatmulAlgoCapAttributes_t as Cap;
use sys::cublasLtMatmulAlgoConfigAttributes_t as Config;
use sys::cublasLtReductionScheme_t as Reduction;

/// A scalar of C type `T` that `get` (a cuBLASLt attribute getter, given the buffer, its size
/// and where to write the size written) fills in: `None` unless it succeeds and writes all of it.
fn scalar<T: Copy + Default>(
    get: impl FnOnce(*mut c_void, usize, &mut usize) -> sys::cublasStatus_t,
) -> Option<T> {
    let mut value = T::default();
    let mut written = 0usize;
    let status = get((&mut value as *mut T).cast(), size_of::<T>(), &mut written);
    (status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && written == size_of::<T>()).then_some(value)
}

/// One configuration attribute of `algo` (`T` the attribute's C type).
fn config<T: Copy + Default>(algo: &sys::cublasLtMatmulAlgo_t, attr: Config) -> Option<T> {
    // SAFETY: the buffer `scalar` passes has room for the size it passes.
    scalar(|buf, size, written| unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, buf, size, written)
    })
}

/// Sets one configuration attribute of `algo`; false when cuBLASLt refuses it.
fn set_config<T: Copy>(algo: &mut sys::cublasLtMatmulAlgo_t, attr: Config, value: T) -> bool {
    // SAFETY: `value` is the attribute's C type, `size_of::<T>()` bytes.
    let status = unsafe {
        sys::cublasLtMatmulAlgoConfigSetAttribute(algo, attr, (&value as *const T).cast(), size_of::<T>())
    };
    status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
}

/// One scalar capability of `algo`.
fn capability<T: Copy + Default>(algo: &sys::cublasLtMatmulAlgo_t, attr: Cap) -> Option<T> {
    // SAFETY: the buffer `scalar` passes has room for the size it passes.
    scalar(|buf, size, written| unsafe {
        sys::cublasLtMatmulAlgoCapGetAttribute(algo, attr, buf, size, written)
    })
}

/// An array capability of `algo` (tile or stage ids): asked for its size, then read.
fn capability_list(algo: &sys::cublasLtMatmulAlgo_t, attr: Cap) -> Vec<u32> {
    let mut bytes = 0usize;
    // SAFETY: a size query (no buffer), as cuBLASLt documents it.
    let status =
        unsafe { sys::cublasLtMatmulAlgoCapGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut bytes) };
    if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS || bytes == 0 || bytes > 4096 {
        return Vec::new();
    }
    let mut ids = vec![0u32; bytes / size_of::<u32>()];
    // SAFETY: `ids` holds the `bytes` the call said it writes (rounded down to whole ids).
    let status = unsafe {
        sys::cublasLtMatmulAlgoCapGetAttribute(
            algo,
            attr,
            ids.as_mut_ptr().cast(),
            ids.len() * size_of::<u32>(),
            &mut bytes,
        )
    };
    if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Vec::new();
    }
    ids
}

/// `algo`'s configuration in cuBLASLt's own enum values: `id 66 tile 20 stages 35 split-K 2
/// reduction 2 swizzle 0 cluster 2`.
pub(super) fn describe(algo: &sys::cublasLtMatmulAlgo_t) -> String {
    if !super::library_present(super::Library::CublasLt, sys::is_culib_present) {
        return "cuBLASLt not loaded".to_string();
    }
    let u = |attr| config::<u32>(algo, attr).map_or("?".to_string(), |v| v.to_string());
    let h = |attr| config::<u16>(algo, attr).map_or("?".to_string(), |v| v.to_string());
    let id = config::<i32>(algo, Config::CUBLASLT_ALGO_CONFIG_ID).map_or("?".to_string(), |v| v.to_string());
    format!(
        "id {id} tile {} stages {} split-K {} reduction {} swizzle {} cluster {}",
        u(Config::CUBLASLT_ALGO_CONFIG_TILE_ID),
        u(Config::CUBLASLT_ALGO_CONFIG_STAGES_ID),
        u(Config::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
        u(Config::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
        u(Config::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
        h(Config::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
    )
}
