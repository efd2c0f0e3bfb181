//! cuDNN convolutions on raw device addresses: a handle per session (from a pool of the
//! process, never destroyed, as for cuBLAS), the descriptors of each convolution, and the
//! algorithm chosen by measurement (`cudnnFindConvolutionForwardAlgorithmEx`) once per shape
//! in the process.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::cudnn::sys::{
    self, cudnnConvolutionFwdAlgo_t, cudnnConvolutionMode_t, cudnnDataType_t, cudnnMathType_t, cudnnStatus_t,
    cudnnTensorFormat_t,
};
use cudarc::driver::CudaStream;

use super::RuntimeError;
use crate::codegen::{ConvFusion, ConvSpec};
use crate::ir::DType;

/// Workspace a convolution's algorithm may use at most (the search's scratch, too).
const WORKSPACE_LIMIT: usize = 256 << 20;

fn check(what: &str, status: cudnnStatus_t) -> Result<(), RuntimeError> {
    check_with(|| what.to_string(), status)
}

/// [`check`], with what was asked described only when it failed.
fn check_with(what: impl FnOnce() -> String, status: cudnnStatus_t) -> Result<(), RuntimeError> {
    match status {
        cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        other => Err(RuntimeError::Driver(format!("cuDNN {}: {other:?}", what()))),
    }
}

/// Whether libcudnn can be loaded.
pub(super) fn available() -> bool {
    super::library_present(super::Library::Cudnn, sys::is_culib_present)
}

/// A cuDNN handle waiting in the pool.
struct PooledHandle(sys::cudnnHandle_t);
// SAFETY: a cuDNN handle may be used from any thread, by one at a time; the pool hands each
// to one user.
unsafe impl Send for PooledHandle {}

static HANDLES: super::DevicePool<PooledHandle> = super::DevicePool::new();

/// A cuDNN handle lent to one session, on its stream.
pub(super) struct Dnn {
    handle: sys::cudnnHandle_t,
    device: usize,
}

// SAFETY: the handle is used by the session that holds it, one thread at a time.
unsafe impl Send for Dnn {}

impl Dnn {
    pub(super) fn new(device: usize, stream: &Arc<CudaStream>) -> Result<Dnn, RuntimeError> {
        if !available() {
            return Err(RuntimeError::NoCudnn);
        }
        let handle = match HANDLES.take(device) {
            Some(PooledHandle(h)) => h,
            None => {
                let mut handle = std::ptr::null_mut();
                // SAFETY: writes one handle; the library was found to load.
                check("create", unsafe { sys::cudnnCreate(&mut handle) })?;
                handle
            }
        };
        let dnn = Dnn { handle, device };
        // SAFETY: the handle is this session's alone until it is given back.
        check("set stream", unsafe {
            sys::cudnnSetStream(dnn.handle, stream.cu_stream() as sys::cudaStream_t)
        })?;
        Ok(dnn)
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        // Off the session's stream, which goes away, onto the default one.
        // SAFETY: the session's work on the handle is done (its stream was synchronized).
        unsafe { sys::cudnnSetStream(self.handle, std::ptr::null_mut()) };
        HANDLES.give(self.device, PooledHandle(self.handle));
    }
}

/// The descriptors of one convolution and the algorithm chosen for it.
pub(super) struct ConvCall {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    pub(super) algo: cudnnConvolutionFwdAlgo_t,
    /// Workspace bytes the algorithm needs.
    pub(super) workspace: usize,
    /// Device addresses of x, w and y.
    addresses: (u64, u64, u64),
    /// The shape, type and GPU, as the choices are cached (and errors name it).
    key: String,
    /// The epilogue as cuDNN's fused bias and activation, where the bundle asks for it and
    /// cuDNN took it at load.
    fused: Option<Fused>,
}

/// The descriptors of a convolution's fused bias, residual and activation.
struct Fused {
    bias: sys::cudnnTensorDescriptor_t,
    activation: sys::cudnnActivationDescriptor_t,
    /// Device addresses of the bias and of `z` (the residual, or y with no residual).
    addresses: (u64, u64),
    residual: bool,
}

impl Drop for Fused {
    fn drop(&mut self) {
        // SAFETY: made by `Fused::new` and destroyed only here.
        unsafe {
            sys::cudnnDestroyTensorDescriptor(self.bias);
            sys::cudnnDestroyActivationDescriptor(self.activation);
        }
    }
}

impl Fused {
    fn new(
        fusion: &ConvFusion,
        data: cudnnDataType_t,
        channels: usize,
        addresses: (u64, u64),
    ) -> Result<Fused, RuntimeError> {
        let mut fused = Fused {
            bias: std::ptr::null_mut(),
            activation: std::ptr::null_mut(),
            addresses,
            residual: fusion.residual.is_some(),
        };
        let mode = match fusion.relu {
            true => sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
            false => sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY,
        };
        // SAFETY: each call writes or sets one descriptor `fused` owns (destroyed on drop).
        unsafe {
            check("bias descriptor", sys::cudnnCreateTensorDescriptor(&mut fused.bias))?;
            check("activation descriptor", sys::cudnnCreateActivationDescriptor(&mut fused.activation))?;
            check(
                "bias",
                sys::cudnnSetTensor4dDescriptor(
                    fused.bias,
                    cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    data,
                    1,
                    int(channels)?,
                    1,
                    1,
                ),
            )?;
            check(
                "activation",
                sys::cudnnSetActivationDescriptor(
                    fused.activation,
                    mode,
                    sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                    0.0,
                ),
            )?;
        }
        Ok(fused)
    }
}

// SAFETY: descriptors are host structures, used by the session that holds them, one thread
// at a time.
unsafe impl Send for ConvCall {}
unsafe impl Sync for ConvCall {}

impl Drop for ConvCall {
    fn drop(&mut self) {
        // SAFETY: made by `ConvCall::new` and destroyed only here.
        unsafe {
            sys::cudnnDestroyTensorDescriptor(self.x);
            sys::cudnnDestroyFilterDescriptor(self.w);
            sys::cudnnDestroyTensorDescriptor(self.y);
            sys::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

fn int(v: usize) -> Result<i32, RuntimeError> {
    i32::try_from(v).map_err(|_| RuntimeError::Driver(format!("convolution size {v} is too large")))
}

/// Whether `algo` sums the products of a convolution as written (an implicit or explicit GEMM,
/// or the direct loop): the algorithms an f32 convolution may take. Winograd's and the FFT's
/// transforms round in f32 on the way, which a deep network amplifies: ResNet-50 (random
/// weights) in f32 came 1.9e-5 (rel-L2) from its unfused build at batch 8 on an H200, over
/// `fusec bench`'s 1e-5 (`benches/NOTES.md`). `FUSEC_CUDNN_ANY_ALGO=1` lets an f32 convolution
/// take any algorithm, for measuring.
fn exact_algo(algo: cudnnConvolutionFwdAlgo_t) -> bool {
    use cudnnConvolutionFwdAlgo_t::*;
    matches!(
        algo,
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
            | CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
            | CUDNN_CONVOLUTION_FWD_ALGO_GEMM
            | CUDNN_CONVOLUTION_FWD_ALGO_DIRECT
    )
}

/// Algorithms chosen in this process, by the convolution's shape, type and GPU.
static CHOSEN: Mutex<Option<HashMap<String, (cudnnConvolutionFwdAlgo_t, usize)>>> = Mutex::new(None);

impl ConvCall {
    /// The descriptors of `spec` at `addresses` (x, w, y), with its algorithm: the one chosen
    /// before for this shape in the process, else the fastest cuDNN measures now (on the
    /// session's buffers, with `scratch` bytes of workspace at `scratch_ptr`).
    pub(super) fn new(
        dnn: &Dnn,
        spec: &ConvSpec,
        addresses: (u64, u64, u64),
        (scratch_ptr, scratch): (u64, usize),
        device_name: &str,
        fused_addresses: Option<(u64, u64)>,
    ) -> Result<ConvCall, RuntimeError> {
        let data = match spec.dtype {
            DType::F16 => cudnnDataType_t::CUDNN_DATA_HALF,
            DType::BF16 => cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            _ => cudnnDataType_t::CUDNN_DATA_FLOAT,
        };
        let nchw = match spec.channels_last {
            true => cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
            false => cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        };
        let mut call = ConvCall {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            workspace: 0,
            addresses,
            key: String::new(),
            fused: None,
        };
        let [n, c, h, w] = spec.x_shape;
        let [k, cg, r, s] = spec.w_shape;
        let [yn, yk, p, q] = spec.y_shape;
        // SAFETY: each call writes or sets one descriptor this call owns (destroyed on drop).
        unsafe {
            check("tensor descriptor", sys::cudnnCreateTensorDescriptor(&mut call.x))?;
            check("tensor descriptor", sys::cudnnCreateTensorDescriptor(&mut call.y))?;
            check("filter descriptor", sys::cudnnCreateFilterDescriptor(&mut call.w))?;
            check("convolution descriptor", sys::cudnnCreateConvolutionDescriptor(&mut call.conv))?;
            check(
                "x",
                sys::cudnnSetTensor4dDescriptor(call.x, nchw, data, int(n)?, int(c)?, int(h)?, int(w)?),
            )?;
            check(
                "y",
                sys::cudnnSetTensor4dDescriptor(call.y, nchw, data, int(yn)?, int(yk)?, int(p)?, int(q)?),
            )?;
            check(
                "w",
                sys::cudnnSetFilter4dDescriptor(call.w, data, nchw, int(k)?, int(cg)?, int(r)?, int(s)?),
            )?;
            check(
                "convolution",
                sys::cudnnSetConvolution2dDescriptor(
                    call.conv,
                    int(spec.pads[0])?,
                    int(spec.pads[1])?,
                    int(spec.strides[0])?,
                    int(spec.strides[1])?,
                    int(spec.dilations[0])?,
                    int(spec.dilations[1])?,
                    cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
            )?;
            check("groups", sys::cudnnSetConvolutionGroupCount(call.conv, int(spec.group)?))?;
            // Half types on tensor cores; f32 in full f32 (no TF32), as for GEMMs.
            let math = match spec.dtype {
                DType::F16 | DType::BF16 => cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
                _ => cudnnMathType_t::CUDNN_FMA_MATH,
            };
            check("math type", sys::cudnnSetConvolutionMathType(call.conv, math))?;
        }
        let key = format!(
            "{device_name} x{:?} w{:?} y{:?} pads{:?} strides{:?} dilations{:?} group{} {} nhwc {}",
            spec.x_shape,
            spec.w_shape,
            spec.y_shape,
            spec.pads,
            spec.strides,
            spec.dilations,
            spec.group,
            spec.dtype,
            spec.channels_last
        );
        let cached =
            CHOSEN.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|m| m.get(&key).copied());
        let (algo, workspace) = match cached {
            Some(chosen) => chosen,
            None => {
                let exact = spec.dtype == DType::F32 && !crate::knobs::on("FUSEC_CUDNN_ANY_ALGO");
                let chosen = call.find(dnn, (scratch_ptr, scratch), &key, exact)?;
                CHOSEN
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert_with(HashMap::new)
                    .insert(key.clone(), chosen);
                chosen
            }
        };
        call.algo = algo;
        call.workspace = workspace;
        if let (Some(fusion), Some(fused_addresses)) = (&spec.fused, fused_addresses) {
            let fused = Fused::new(fusion, data, k, fused_addresses)?;
            // Taken only if cuDNN runs it with the chosen algorithm (its fused form supports
            // fewer); else the epilogue kernel runs.
            match call.forward_fused(dnn, &fused, (scratch_ptr, scratch)) {
                cudnnStatus_t::CUDNN_STATUS_SUCCESS => call.fused = Some(fused),
                refused => tracing::debug!("cuDNN fused bias and activation for {key}: {refused:?}"),
            }
        }
        call.key = key;
        Ok(call)
    }

    /// The fastest algorithm cuDNN measures for this convolution (`key`, in the debug log)
    /// within the workspace; of the [`exact_algo`]s alone where `exact`.
    fn find(
        &self,
        dnn: &Dnn,
        (scratch_ptr, scratch): (u64, usize),
        key: &str,
        exact: bool,
    ) -> Result<(cudnnConvolutionFwdAlgo_t, usize), RuntimeError> {
        const WANTED: usize = 16;
        // SAFETY: all-zero bytes are a valid value of this plain C struct.
        let mut results: [sys::cudnnConvolutionFwdAlgoPerf_t; WANTED] = unsafe { std::mem::zeroed() };
        let mut returned = 0;
        let (x, w, y) = self.addresses;
        // Searched twice, the first one's times thrown away: a search times each algorithm
        // about once, and an algorithm whose kernels the process has not run yet pays for
        // loading them (lazy module loading) in its time. One search alone picked an
        // implicit GEMM at 0.16 ms over a precomputed one at 0.010 ms for ResNet-50's 3×3
        // 64→64 convolution, in one process of two (`benches/NOTES.md`).
        for _ in 0..2 {
            // SAFETY: the descriptors describe the buffers at these addresses (the session's
            // arena and weights), and the scratch holds `scratch` bytes; the search writes y.
            check("algorithm search", unsafe {
                sys::cudnnFindConvolutionForwardAlgorithmEx(
                    dnn.handle,
                    self.x,
                    x as *const c_void,
                    self.w,
                    w as *const c_void,
                    self.conv,
                    self.y,
                    y as *mut c_void,
                    WANTED as i32,
                    &mut returned,
                    results.as_mut_ptr(),
                    scratch_ptr as *mut c_void,
                    scratch,
                )
            })?;
        }
        let results = &results[..returned.max(0) as usize];
        for r in results {
            tracing::debug!(
                "cuDNN search {key}: {:?} {:?} {:.4} ms, {} bytes",
                r.algo,
                r.status,
                r.time,
                r.memory
            );
        }
        // The search lists one algorithm several times (its engines), each with its own
        // workspace; the forward call picks an engine of the algorithm itself, whose
        // workspace cuDNN states apart. The call is given the larger of the two: with the
        // search's alone, ViT-B/16's patch embedding (NCHW) was refused (BAD_PARAM).
        for r in results
            .iter()
            .filter(|r| r.status == cudnnStatus_t::CUDNN_STATUS_SUCCESS && (!exact || exact_algo(r.algo)))
        {
            let mut needed = 0usize;
            // SAFETY: the descriptors are this call's; writes one size.
            let sized = unsafe {
                sys::cudnnGetConvolutionForwardWorkspaceSize(
                    dnn.handle,
                    self.x,
                    self.w,
                    self.conv,
                    self.y,
                    r.algo,
                    &mut needed,
                )
            };
            let needed = needed.max(r.memory);
            if sized != cudnnStatus_t::CUDNN_STATUS_SUCCESS || needed > scratch {
                continue;
            }
            // One forward call as the session will make it; an algorithm the call refuses
            // gives way to the next one found.
            match self.forward(dnn, r.algo, (scratch_ptr, scratch)) {
                cudnnStatus_t::CUDNN_STATUS_SUCCESS => return Ok((r.algo, needed)),
                refused => tracing::debug!("cuDNN {key}: {:?} refused ({refused:?})", r.algo),
            }
        }
        Err(RuntimeError::Driver(format!("cuDNN found no algorithm for convolution {key}")))
    }

    /// Issues the convolution on the handle's stream, with `workspace` at `workspace_ptr`.
    pub(super) fn launch(&self, dnn: &Dnn, workspace: (u64, usize)) -> Result<(), RuntimeError> {
        let what = || {
            format!(
                "convolution {} ({:?}, workspace {} bytes of {})",
                self.key, self.algo, self.workspace, workspace.1
            )
        };
        let status = match &self.fused {
            Some(fused) => self.forward_fused(dnn, fused, workspace),
            None => self.forward(dnn, self.algo, workspace),
        };
        check_with(what, status)
    }

    /// Whether cuDNN runs the epilogue (bias, residual, activation) with the convolution.
    pub(super) fn fused(&self) -> bool {
        self.fused.is_some()
    }

    /// `cudnnConvolutionBiasActivationForward`: `y = act(conv(x, w) + z + bias)`.
    fn forward_fused(
        &self,
        dnn: &Dnn,
        fused: &Fused,
        (workspace_ptr, workspace): (u64, usize),
    ) -> cudnnStatus_t {
        let alpha1 = 1.0f32;
        let alpha2 = if fused.residual { 1.0f32 } else { 0.0 };
        let (x, w, y) = self.addresses;
        let (bias, z) = fused.addresses;
        // SAFETY: as in `forward`; z has y's shape and layout, the bias holds K elements.
        unsafe {
            sys::cudnnConvolutionBiasActivationForward(
                dnn.handle,
                &alpha1 as *const f32 as *const c_void,
                self.x,
                x as *const c_void,
                self.w,
                w as *const c_void,
                self.conv,
                self.algo,
                workspace_ptr as *mut c_void,
                workspace,
                &alpha2 as *const f32 as *const c_void,
                self.y,
                z as *const c_void,
                fused.bias,
                bias as *const c_void,
                fused.activation,
                self.y,
                y as *mut c_void,
            )
        }
    }

    /// `cudnnConvolutionForward` with algorithm `algo`.
    fn forward(
        &self,
        dnn: &Dnn,
        algo: cudnnConvolutionFwdAlgo_t,
        (workspace_ptr, workspace): (u64, usize),
    ) -> cudnnStatus_t {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (x, w, y) = self.addresses;
        // SAFETY: the descriptors describe the buffers at these addresses (the session's
        // arena and weights); the workspace holds `workspace` bytes.
        unsafe {
            sys::cudnnConvolutionForward(
                dnn.handle,
                &alpha as *const f32 as *const c_void,
                self.x,
                x as *const c_void,
                self.w,
                w as *const c_void,
                self.conv,
                algo,
                workspace_ptr as *mut c_void,
                workspace,
                &beta as *const f32 as *const c_void,
                self.y,
                y as *mut c_void,
            )
        }
    }
}

/// The scratch a session gives the algorithm search and keeps as workspace: at most
/// [`WORKSPACE_LIMIT`], and at most a quarter of the memory free.
pub(super) fn scratch_bytes(free: usize) -> usize {
    WORKSPACE_LIMIT.min(free / 4)
}
