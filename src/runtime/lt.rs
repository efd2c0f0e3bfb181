//! cuBLASLt GEMMs with the bias (and ReLU / tanh-GELU) epilogue run inside the GEMM kernel.
//!
//! Everything a call needs (descriptors, layouts, the algorithm) is chosen once when the
//! session loads; a run only calls `cublasLtMatmul`, so it can be captured into a CUDA graph.
//! Same row-major trick as the cuBLAS path: `Cᵀ = Bᵀ·Aᵀ`, so cuBLASLt's A is our B, the
//! result has N rows in column-major terms, and the bias (N elements) runs along them.

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::RuntimeError;
use crate::codegen::{GemmSpec, LtActivation};
use crate::ir::DType;

/// cuBLASLt's recommended workspace on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_error(what: &str, e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Driver(format!("cuBLASLt {what}: {e:?}"))
}

/// A cuBLASLt handle and its workspace, owned by one session.
pub(super) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    workspace_ptr: u64,
}

/// One GEMM, ready to run.
pub(super) struct LtGemm {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
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

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Lt::new` and is destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl Lt {
    /// A handle, or `None` when libcublasLt cannot be loaded.
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<Option<Lt>, RuntimeError> {
        // SAFETY: only tries to dlopen libcublasLt.
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        let handle = lt::create_handle().map_err(|e| lt_error("handle", e))?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES).map_err(|e| lt_error("workspace", e))?;
        let workspace_ptr = workspace.device_ptr(stream).0;
        Ok(Some(Lt { handle, workspace, workspace_ptr }))
    }

    /// Descriptors and an algorithm for `g` with its epilogue, the bias at `bias`; `None` when
    /// cuBLASLt offers no algorithm (the caller then runs cuBLAS and the epilogue kernel).
    pub(super) fn prepare(&self, g: &GemmSpec, bias: u64) -> Option<LtGemm> {
        let epilogue = g.lt_epilogue?;
        let ty = match g.dtype {
            DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
            DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
            DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
            _ => return None,
        };
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        // cuBLASLt's A is our B (N×K column-major when not transposed), its B our A.
        let a = if g.b.transposed { (k, n, k) } else { (n, k, n) };
        let b = if g.a.transposed { (m, k, m) } else { (k, m, k) };
        let layout =
            |(rows, cols, ld): (u64, u64, u64)| lt::create_matrix_layout(ty, rows, cols, ld as i64).ok();
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .ok()?;
        let mut gemm = LtGemm {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        gemm.layouts = [layout(a)?, layout(b)?, layout((n, m, n))?];
        let code = match epilogue.activation {
            LtActivation::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            LtActivation::Relu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            LtActivation::GeluTanh => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
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
        set(Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, (&bias as *const u64).cast(), size_of::<u64>())?;
        let pref = lt::create_matmul_pref().ok()?;
        let size = WORKSPACE_BYTES;
        // SAFETY: the attribute takes a size_t; every descriptor is live.
        let heuristic = unsafe {
            let ok = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&size as *const usize).cast(),
                size_of::<usize>(),
            );
            let found = ok.and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    gemm.desc,
                    gemm.layouts[0],
                    gemm.layouts[1],
                    gemm.layouts[2],
                    gemm.layouts[2],
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            found.ok()?
        };
        gemm.algo = heuristic.algo;
        Some(gemm)
    }

    /// Issues `gemm` on `stream`: our A at `a`, B at `b`, the result written to `c`.
    pub(super) fn run(
        &self,
        gemm: &LtGemm,
        g: &GemmSpec,
        (a, b, c): (u64, u64, u64),
        stream: &CudaStream,
    ) -> Result<(), RuntimeError> {
        let (alpha, beta) = (g.alpha, 0.0f32);
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
                c as *const c_void,
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
