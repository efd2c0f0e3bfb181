//! Launching one step: a generated kernel (plainly or with programmatic dependent launch)
//! or a GEMM on cuBLAS/cuBLASLt with its epilogue kernel.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use std::sync::Arc;

use super::super::blas;
use super::super::dnn::ConvCall;
use super::{lt, RuntimeError, Session};
use crate::codegen::{ConvSpec, GemmSpec, KernelSource};
use crate::plan::Location;

#[derive(Clone)]
pub(super) struct Launch {
    pub(super) name: String,
    pub(super) function: CudaFunction,
    pub(super) config: LaunchConfig,
    /// Device pointers, one per pointer parameter of the kernel; then, for a kernel of a
    /// bundle with ranges, its units of work (when bound) and the size of each range.
    pub(super) args: Vec<u64>,
    /// How many of `args` are pointers.
    pub(super) pointers: usize,
    /// Launched with programmatic stream serialization: the kernel waits for the one before
    /// it itself (`fusec::grid_begin`), so it may be scheduled while that one finishes.
    pub(super) programmatic: bool,
    /// The kernel begins with that wait ([`waits_for_predecessor`]): it may be launched so.
    pub(super) waits: bool,
    /// How the launch follows the bundle's ranges.
    pub(super) scale: Option<crate::codegen::LaunchScale>,
    /// The kernel tiled for other points of the ranges, by tiling, and the sizes that choose
    /// among them ([`crate::codegen::KernelSource::variants`]).
    pub(super) variants: Vec<(crate::codegen::Tiling, Launch)>,
    pub(super) attention: Option<Box<crate::codegen::AttentionDims>>,
    /// The steps this launch also runs ([`crate::codegen::KernelSource::merges`]), left out.
    pub(super) merges: Vec<usize>,
}

impl Launch {
    /// Launched with programmatic dependent launch or not (where the kernel waits for its
    /// predecessor), its variants for other points of the ranges alike.
    pub(super) fn set_programmatic(&mut self, on: bool) {
        self.programmatic = on && self.waits;
        for (_, variant) in &mut self.variants {
            variant.set_programmatic(on);
        }
    }

    /// The launch at the point `values` of the bundle's ranges: of the variant tiled for it,
    /// where there is one.
    pub(super) fn at(&self, values: &[usize]) -> Result<Launch, RuntimeError> {
        let tiling = self.attention.as_ref().and_then(|a| a.tiling_at(values));
        if let Some((_, variant)) = self.variants.iter().find(|(t, _)| Some(*t) == tiling) {
            let mut launch = variant.at(values)?;
            // The variants stay with the launch, for the next point.
            launch.variants = self.variants.clone();
            launch.attention = self.attention.clone();
            return Ok(launch);
        }
        let mut launch = self.clone();
        if let Some(scale) = &self.scale {
            let (units, blocks) = scale.at(values).ok_or_else(|| {
                RuntimeError::Input(format!("kernel {}: its launch at {values:?} overflows", self.name))
            })?;
            launch.config.grid_dim.0 = blocks;
            launch.args.truncate(self.pointers);
            if scale.bound {
                launch.args.push(units);
            }
            launch.args.extend(values.iter().map(|&v| v as u64));
        }
        Ok(launch)
    }
}

/// Whether a session's generated kernels are launched with programmatic dependent launch on a
/// GPU of compute capability `major`, where that is settled before the program is timed: never
/// before sm_90; `FUSEC_PDL=1` / `0` on or off for every session; on where the session asks
/// for it ([`super::SessionOptions::programmatic_launch`]: a generator's one-token steps).
/// `None`: the session times its program both ways at load and keeps the faster
/// ([`Session::choose_programmatic`]). Each kernel also has to start with the wait for its
/// predecessor ([`waits_for_predecessor`]).
pub(super) fn programmatic_launch_forced(major: i32, asked: bool) -> Option<bool> {
    if major < 9 {
        return Some(false);
    }
    match std::env::var("FUSEC_PDL").ok().as_deref().map(str::trim) {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => asked.then_some(true),
    }
}

/// Whether kernel `source` begins with the wait for its predecessor (bundles written before
/// the wait was added do not).
pub(super) fn waits_for_predecessor(source: &KernelSource) -> bool {
    source.source.contains("fusec::grid_begin();")
}

pub(super) enum Loaded {
    Kernel(Launch),
    /// A cuBLAS or (`lt`) cuBLASLt GEMM, and its epilogue kernel unless cuBLASLt runs the
    /// epilogue inside the GEMM.
    Gemm {
        gemm: GemmSpec,
        epilogue: Option<Launch>,
        /// Runs on cuBLAS even though `lt` is prepared (a GEMM with no epilogue cuBLASLt
        /// runs, for which cuBLAS was measured faster or nothing was measured).
        on_cublas: bool,
        lt: Option<Box<lt::LtGemm>>,
        /// fusec's kernel for the product and its epilogue (a product of a few rows,
        /// [`crate::codegen::Step::Gemm`]'s `skinny`), run instead of the library call where
        /// `on_skinny`.
        skinny: Option<Launch>,
        /// The same kernel with narrower column tiles (`skinny_narrow` of the step).
        skinny_narrow: Option<Box<Launch>>,
        /// The product runs as `skinny` (chosen by timing the program).
        on_skinny: bool,
        /// With `on_skinny`: as `skinny_narrow`.
        on_narrow: bool,
        /// The norm step `skinny` computes itself: [`Loaded::Absorbed`] while it runs.
        absorbs: Option<usize>,
    },
    /// A step not run: a norm (or gate) kernel the GEMM after it computes itself (its kernel
    /// for a few rows), or a pointwise kernel another step's launch runs (`Launch::merges`).
    Absorbed(Launch),
    /// A GEMM step not run: a kernel after it computes the product itself (`Launch::merges`:
    /// the decoding attention that takes its Q, K and V projection in). Its name, for profiles.
    Merged(String),
    /// A cuDNN convolution, and its epilogue kernel (the bias and fused pointwise ops) where
    /// cuDNN does not run them in its fused form.
    Conv {
        spec: ConvSpec,
        /// Descriptors and algorithm, shared by every point of a bundle's ranges.
        call: Arc<ConvCall>,
        epilogue: Option<Launch>,
        /// For a convolution whose batch follows a bundle's ranges, at the top of them: the
        /// epilogue kernel, loaded even where cuDNN's fused form runs it here, for the points
        /// whose convolution cuDNN does not fuse ([`Session::steps_at`]).
        spare: Option<Box<Launch>>,
    },
}

impl Loaded {
    /// The generated kernels of the step whose launch the session chooses: all but a GEMM's
    /// kernel for a few rows (launched with programmatic dependent launch wherever it may be:
    /// its first weights are requested before its wait).
    pub(super) fn kernels_mut(&mut self) -> Vec<&mut Launch> {
        match self {
            Loaded::Kernel(launch) | Loaded::Absorbed(launch) => vec![launch],
            Loaded::Merged(_) => Vec::new(),
            Loaded::Gemm { epilogue, .. } => epilogue.iter_mut().collect(),
            Loaded::Conv { epilogue, spare, .. } => {
                epilogue.iter_mut().chain(spare.iter_mut().map(|b| &mut **b)).collect()
            }
        }
    }

    /// Whether a library call's epilogue runs as a kernel of its own after it.
    pub(super) fn has_epilogue(&self) -> bool {
        matches!(self, Loaded::Gemm { epilogue: Some(_), .. } | Loaded::Conv { epilogue: Some(_), .. })
    }

    /// What the step runs, as profiles name it.
    pub(super) fn name(&self) -> String {
        match self {
            Loaded::Kernel(launch) => launch.name.clone(),
            Loaded::Absorbed(launch) => format!("{} (in another step's kernel)", launch.name),
            Loaded::Merged(name) => format!("{name} (in another step's kernel)"),
            Loaded::Conv { spec, epilogue, call, .. } => {
                let [_, _, r, s] = spec.w_shape;
                let fused = if call.fused() { " + bias/activation" } else { "" };
                let algo = format!("{:?}", call.algo);
                let algo = algo.trim_start_matches("CUDNN_CONVOLUTION_FWD_ALGO_");
                let conv = format!(
                    "cuDNN conv{fused} {:?} {r}x{s} /{} -> {:?} ({algo})",
                    spec.x_shape, spec.strides[0], spec.y_shape
                );
                match epilogue {
                    Some(e) => format!("{conv} + {}", e.name),
                    None => conv,
                }
            }
            Loaded::Gemm { gemm, epilogue, on_cublas, lt, on_skinny, absorbs, .. } => {
                let shape = format!("{}x{}x{}", gemm.m, gemm.n, gemm.k);
                let batch = if gemm.batch > 1 { format!(" batch {}", gemm.batch) } else { String::new() };
                if *on_skinny {
                    let e = gemm.lt_epilogue.map(|e| format!(" +{}", e.describe())).unwrap_or_default();
                    let norm = if absorbs.is_some() { "norm + " } else { "" };
                    return format!("fusec skinny {norm}gemm {shape}{e}");
                }
                let library = if lt.is_some() && !on_cublas { "cuBLASLt" } else { "cuBLAS" };
                match epilogue {
                    None if gemm.lt_epilogue.is_some() && lt.is_some() => {
                        let e = gemm.lt_epilogue.map(|e| e.describe()).unwrap_or_default();
                        format!("cuBLASLt gemm {shape}{batch} +{e}")
                    }
                    Some(e) => format!("{library} gemm {shape}{batch} + {}", e.name),
                    None => format!("{library} gemm {shape}{batch}"),
                }
            }
        }
    }
}

impl Session {
    pub(super) fn execute_step(&self, step: &Loaded) -> Result<(), RuntimeError> {
        self.execute_library(step)?;
        if let Loaded::Gemm { on_skinny: true, .. } = step {
            // The kernel ran the epilogue too.
            return Ok(());
        }
        match step {
            Loaded::Gemm { epilogue: Some(launch), .. } | Loaded::Conv { epilogue: Some(launch), .. } => {
                self.launch(launch)
            }
            _ => Ok(()),
        }
    }

    /// A step without its epilogue kernel: a kernel step whole, a GEMM's or convolution's
    /// library call alone.
    pub(super) fn execute_library(&self, step: &Loaded) -> Result<(), RuntimeError> {
        match step {
            Loaded::Kernel(launch) => self.launch(launch),
            Loaded::Absorbed(_) | Loaded::Merged(_) => Ok(()),
            Loaded::Gemm { skinny: Some(launch), on_skinny: true, on_narrow: false, .. } => {
                self.launch(launch)
            }
            Loaded::Gemm { skinny_narrow: Some(launch), on_skinny: true, on_narrow: true, .. } => {
                self.launch(launch)
            }
            Loaded::Gemm { gemm, lt: Some(prepared), on_cublas: false, .. } => {
                let lt = self.lt.as_ref().ok_or_else(|| RuntimeError::Driver("no cuBLASLt handle".into()))?;
                let addresses =
                    (self.address(gemm.a.location), self.address(gemm.b.location), self.address(gemm.c));
                let residual = gemm.lt_epilogue.and_then(|e| e.residual).map(|r| self.address(r));
                lt.run(prepared, gemm, addresses, residual, &self.stream)
            }
            Loaded::Gemm { gemm, .. } => self.gemm(gemm),
            Loaded::Conv { call, .. } => {
                let dnn = self.dnn.as_ref().ok_or_else(|| RuntimeError::Driver("no cuDNN handle".into()))?;
                call.launch(dnn, self.conv_workspace())
            }
        }
    }

    pub(super) fn launch(&self, launch: &Launch) -> Result<(), RuntimeError> {
        if launch.programmatic {
            return self.launch_programmatic(launch);
        }
        let mut args = self.stream.launch_builder(&launch.function);
        for pointer in &launch.args {
            args.arg(pointer);
        }
        // SAFETY: every generated kernel takes one device pointer per buffer it touches,
        // each checked at load to start inside the arena or the weights, and touches only
        // the bytes the plan gave that buffer.
        unsafe { args.launch(launch.config) }.map_err(|e| launch_failed(launch, e))?;
        Ok(())
    }

    /// [`Session::launch`] through `cuLaunchKernelEx` with programmatic stream serialization
    /// allowed (captured into the graph as a programmatic edge).
    pub(super) fn launch_programmatic(&self, launch: &Launch) -> Result<(), RuntimeError> {
        use cudarc::driver::sys;
        // SAFETY: a plain C struct (an id and a union of plain values); zero is valid.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let (grid, block) = (launch.config.grid_dim, launch.config.block_dim);
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: launch.config.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: 1,
        };
        let mut params: Vec<*mut std::ffi::c_void> =
            launch.args.iter().map(|a| (a as *const u64).cast_mut().cast()).collect();
        // SAFETY: as in `launch`: one device pointer per kernel parameter, each inside the
        // session's memory; `params` points at them and outlives the call, which copies them.
        // The kernel begins with `fusec::grid_begin`, so it touches no memory before the
        // kernel before it has completed.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                launch.function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| launch_failed(launch, e))
    }

    pub(super) fn address(&self, location: Location) -> u64 {
        device_address(location, self.arena_ptr, self.weights_ptr)
    }

    pub(super) fn gemm(&self, g: &GemmSpec) -> Result<(), RuntimeError> {
        let addresses = (self.address(g.a.location), self.address(g.b.location), self.address(g.c));
        blas::gemm(self.blas.handle()?, g, addresses)
    }
}

/// A launch the driver refused, named by its kernel.
pub(super) fn launch_failed(launch: &Launch, e: cudarc::driver::DriverError) -> RuntimeError {
    let ((grid, ..), (block, ..)) = (launch.config.grid_dim, launch.config.block_dim);
    RuntimeError::Driver(format!("launching kernel {} (grid {grid}, block {block}): {e:?}", launch.name))
}

/// The device address of `location` given where the arena and the weights start.
pub(super) fn device_address(location: Location, arena_ptr: u64, weights_ptr: u64) -> u64 {
    match location {
        Location::Arena(o) => arena_ptr + o as u64,
        Location::Weights(o) => weights_ptr + o as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::programmatic_launch_forced;

    #[test]
    fn programmatic_launch_is_timed_unless_settled() {
        // Never before sm_90, whatever is asked.
        assert_eq!(programmatic_launch_forced(8, true), Some(false));
        assert_eq!(programmatic_launch_forced(8, false), Some(false));
        if std::env::var_os("FUSEC_PDL").is_some() {
            eprintln!("FUSEC_PDL is set: the default choices are not checked");
            return;
        }
        assert_eq!(programmatic_launch_forced(9, true), Some(true));
        assert_eq!(programmatic_launch_forced(9, false), None);
        assert_eq!(programmatic_launch_forced(10, false), None);
    }
}
