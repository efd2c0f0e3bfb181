//! cuBLAS GEMMs on raw device addresses (the session's steps and the start-up GEMM-rate
//! measurement of `fusec bench` both go through here).

use std::sync::Arc;

use cudarc::cublas::sys::{cublasOperation_t, cublasStatus_t};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream};

use super::RuntimeError;
use crate::codegen::GemmSpec;
use crate::ir::DType;

/// A cuBLAS handle lent to one user (a session, the rate measurement) on its stream, and given
/// back to a pool of the process when dropped: handles are made once per device and user at
/// a time, and never destroyed. `cublasDestroy` and `cublasLtDestroy` crashed inside the
/// driver (SIGSEGV on a null pointer) when sessions were dropped on several threads at once:
/// 6 of 6 runs of `examples/soak.rs churn` on the H100 (`tests/RELIABILITY.md`). Destroying
/// a handle also synchronizes the whole device, every other session's work included.
pub(super) struct Blas {
    blas: Option<CudaBlas>,
    device: usize,
    ctx: Arc<CudaContext>,
}

static BLAS_HANDLES: super::DevicePool<CudaBlas> = super::DevicePool::new();

impl Blas {
    pub(super) fn new(device: usize, stream: &Arc<CudaStream>) -> Result<Blas, RuntimeError> {
        let blas = match BLAS_HANDLES.take(device) {
            Some(mut blas) => {
                // SAFETY: the handle is this user's alone until it is given back.
                unsafe { blas.set_stream(stream.clone()) }
                    .map_err(|e| RuntimeError::Driver(format!("cuBLAS stream: {e:?}")))?;
                blas
            }
            None => {
                CudaBlas::new(stream.clone()).map_err(|e| RuntimeError::Driver(format!("cuBLAS: {e:?}")))?
            }
        };
        Ok(Blas { blas: Some(blas), device, ctx: stream.context().clone() })
    }

    pub(super) fn handle(&self) -> Result<&CudaBlas, RuntimeError> {
        self.blas.as_ref().ok_or_else(|| RuntimeError::Driver("no cuBLAS handle".into()))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let Some(mut blas) = self.blas.take() else { return };
        // Off the user's stream, which may go away, onto the context's default stream.
        let default = self.ctx.default_stream();
        // SAFETY: the user's work on the handle is done (its stream was synchronized).
        if unsafe { blas.set_stream(default) }.is_ok() {
            BLAS_HANDLES.give(self.device, blas);
        } else {
            // Kept from `cublasDestroy` all the same (see above).
            std::mem::forget(blas);
        }
    }
}

/// Row-major `C = A·B` through column-major cuBLAS: `Cᵀ = Bᵀ·Aᵀ`, so B goes first and the
/// roles of M and N swap. A row-major matrix read untransposed is column-major with its
/// row length as leading dimension; a transposed one is read with the op flag.
pub(super) fn gemm(blas: &CudaBlas, g: &GemmSpec, (a, b, c): (u64, u64, u64)) -> Result<(), RuntimeError> {
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let ld_b = if g.b.transposed { g.k } else { g.n };
    let ld_a = if g.a.transposed { g.m } else { g.k };
    let (alpha, beta) = (g.alpha, 0.0f32);
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| RuntimeError::Driver(format!("GEMM dimension {v} is too large")))
    };
    if g.dtype != DType::F32 {
        return gemm_half(
            blas,
            g,
            (a, b, c),
            (op(g.b.transposed), op(g.a.transposed)),
            (int(ld_b)?, int(ld_a)?),
        );
    }
    // SAFETY: the pointers are inside the arena/weights allocations at offsets the plan
    // sized for these matrices; the handle is bound to this session's stream.
    let status = unsafe {
        cudarc::cublas::sys::cublasSgemmStridedBatched(
            *blas.handle(),
            op(g.b.transposed),
            op(g.a.transposed),
            int(g.n)?,
            int(g.m)?,
            int(g.k)?,
            &alpha,
            b as *const f32,
            int(ld_b)?,
            g.b.batch_stride as i64,
            a as *const f32,
            int(ld_a)?,
            g.a.batch_stride as i64,
            &beta,
            c as *mut f32,
            int(g.n)?,
            (g.m * g.n) as i64,
            int(g.batch)?,
        )
    };
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(RuntimeError::Driver(format!("cuBLAS SGEMM failed: {status:?}")));
    }
    Ok(())
}

/// f16/bf16 operands, result of their type or f32, f32 accumulation (same operand order as
/// `gemm`).
fn gemm_half(
    blas: &CudaBlas,
    g: &GemmSpec,
    (a, b, c): (u64, u64, u64),
    (op_b, op_a): (cublasOperation_t, cublasOperation_t),
    (ld_b, ld_a): (i32, i32),
) -> Result<(), RuntimeError> {
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
    let type_of = |dtype: DType| match dtype {
        DType::F16 => Ok(cudaDataType::CUDA_R_16F),
        DType::BF16 => Ok(cudaDataType::CUDA_R_16BF),
        DType::F32 => Ok(cudaDataType::CUDA_R_32F),
        other => Err(RuntimeError::Driver(format!("no GEMM for {other}"))),
    };
    // C in its own type: f32 where the product is stored widened.
    let (ty, c_ty) = (type_of(g.dtype)?, type_of(g.c_dtype())?);
    let (alpha, beta) = (g.alpha, 0.0f32);
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| RuntimeError::Driver(format!("GEMM dimension {v} is too large")))
    };
    // SAFETY: as in `gemm`; alpha and beta are f32 because the compute type is 32F.
    let status = unsafe {
        cudarc::cublas::sys::cublasGemmStridedBatchedEx(
            *blas.handle(),
            op_b,
            op_a,
            int(g.n)?,
            int(g.m)?,
            int(g.k)?,
            (&alpha as *const f32).cast(),
            b as *const std::ffi::c_void,
            ty,
            ld_b,
            g.b.batch_stride as i64,
            a as *const std::ffi::c_void,
            ty,
            ld_a,
            g.a.batch_stride as i64,
            (&beta as *const f32).cast(),
            c as *mut std::ffi::c_void,
            c_ty,
            int(g.n)?,
            (g.m * g.n) as i64,
            int(g.batch)?,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(RuntimeError::Driver(format!("cuBLAS GemmEx ({}) failed: {status:?}", g.dtype)));
    }
    Ok(())
}
