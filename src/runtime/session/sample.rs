//! Tokens drawn from rows of logits on the GPU (`kernels/sample_rows.cu`): top-k or top-p at a
//! temperature, one draw in [0, 1) a row given by the caller, so that only the chosen ids leave
//! the GPU; a row is a cluster of blocks on sm_90 and later, a block before. The choice is the host sampler's (`generate::Sampler::choose_with`) for the same
//! draw.

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

use super::state::RowCopyLaunch;
use super::{driver, RuntimeError, Session};
use cudarc::driver::CudaFunction;

/// PTX of `kernels/sample_rows.cu` (see kernels/README.md): a block a row.
const SAMPLE_PTX: &str = include_str!("../../../kernels/sample_rows.ptx");

/// PTX of `kernels/sample_rows.cu` for sm_90+ (`-DSAMPLE_CLUSTER=8`): a cluster of
/// [`SAMPLE_CLUSTER`] blocks a row, each an eighth of it.
const SAMPLE_CLUSTER_PTX: &str = include_str!("../../../kernels/sample_rows_cluster.ptx");

/// Blocks a row of the cluster kernel (its `SAMPLE_CLUSTER`).
const SAMPLE_CLUSTER: usize = 8;

/// Threads a block of each kernel (their `THREADS`): a block a row, a block of a cluster.
const SAMPLE_THREADS: u32 = 1024;
const SAMPLE_CLUSTER_THREADS: u32 = 512;

/// Which tokens a draw is among.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowDraw {
    /// The `k` most likely.
    TopK(usize),
    /// The most likely whose probabilities reach `p` (0 < p ≤ 1).
    TopP(f64),
}

/// Which rows of an output are drawn from: row `offset`, then every `step`-th after it, `rows`
/// of them, each `width` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampledRows {
    /// Rows drawn from.
    pub rows: usize,
    /// Values a row.
    pub width: usize,
    /// Rows from one drawn to the next.
    pub step: usize,
    /// The first row drawn from.
    pub offset: usize,
}

/// Where a launch of the sampling kernel writes its ids and reads its draws.
pub(super) struct SampleTo<'a> {
    /// Device address of the ids.
    pub out: u64,
    /// Device addresses of mapped page-locked memory for the ids and the draws: the ids are
    /// written there too, the draws read from there (the caller wrote them) rather than copied
    /// to the device.
    pub mapped: Option<(u64, u64)>,
    /// A copy run beside the draw, in blocks of its own.
    pub copying: Option<&'a RowCopyLaunch>,
}

/// The sampling kernels of one module load ([`Session::sample_kernels`]).
#[derive(Clone)]
pub(super) struct SampleKernels {
    /// The draw.
    plain: CudaFunction,
    /// The draw with a copy beside it (`fusec_sample_rows_copying`).
    copying: CudaFunction,
    /// Blocks a row.
    blocks: usize,
    /// Threads a block.
    threads: u32,
    /// The most shared memory a block may opt in to, bytes.
    optin: usize,
    /// `FUSEC_SAMPLE_SHARED_WEIGHTS=0`: the weights kept in global memory.
    weights_apart: bool,
}

impl Session {
    /// The sampling kernels, the blocks they take a row and their threads, loaded on first use
    /// (or by [`Session::warm_up`]): a cluster of [`SAMPLE_CLUSTER`] blocks on sm_90 and later
    /// (`FUSEC_SAMPLE_CLUSTER=0`: a block a row there too), else a block.
    pub(super) fn sample_kernels(&mut self) -> Result<SampleKernels, RuntimeError> {
        if self.state.sample.is_none() {
            let sm = self.arch.trim_start_matches("sm_").parse::<u32>().unwrap_or(0);
            let clusters =
                sm >= 90 && std::env::var("FUSEC_SAMPLE_CLUSTER").map_or(true, |v| v.trim() != "0");
            let (ptx, blocks, threads) = if clusters {
                (SAMPLE_CLUSTER_PTX, SAMPLE_CLUSTER, SAMPLE_CLUSTER_THREADS)
            } else {
                (SAMPLE_PTX, 1, SAMPLE_THREADS)
            };
            let [plain, copying] =
                self.load_kernels(ptx, ["fusec_sample_rows", "fusec_sample_rows_copying"])?;
            let optin = self
                .stream
                .context()
                .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .map_or(0, |b| b.max(0) as usize);
            let weights_apart = crate::knobs::off("FUSEC_SAMPLE_SHARED_WEIGHTS");
            self.state.sample = Some(SampleKernels { plain, copying, blocks, threads, optin, weights_apart });
        }
        self.state
            .sample
            .clone()
            .ok_or_else(|| RuntimeError::Driver("the sampling kernel did not load".into()))
    }

    /// One token drawn from each of `at`'s rows of f32 output `name` of the last run, `draw`
    /// at `temperature`, with `draws[i]` (in [0, 1)) the draw of the `i`-th row: on the GPU,
    /// only the ids come back.
    pub fn sample_rows(
        &mut self,
        name: &str,
        at: SampledRows,
        draw: RowDraw,
        temperature: f64,
        draws: &[f64],
    ) -> Result<Vec<i64>, RuntimeError> {
        self.ids_back(at.rows, |session, ids| {
            session.launch_sample(
                name,
                at,
                (draw, temperature),
                draws,
                SampleTo { out: ids, mapped: None, copying: None },
            )
        })
    }

    /// Launches the sampling kernel over rows `at` of f32 output `name` ([`Session::sample_rows`]'s
    /// checks), writing `at.rows` i64 ids where `to` says (checked by the caller to hold
    /// them); with a copy, the kernel that also runs it in blocks of its own.
    pub(super) fn launch_sample(
        &mut self,
        name: &str,
        at: SampledRows,
        (draw, temperature): (RowDraw, f64),
        draws: &[f64],
        to: SampleTo<'_>,
    ) -> Result<(), RuntimeError> {
        let spec = Self::spec(&self.outputs, name, "output")?;
        let size = spec.tensor_type().map_or(0, |t| t.size_bytes());
        let SampledRows { rows, width, step, offset } = at;
        let last_row = (rows.max(1) - 1) * step + offset;
        if spec.dtype != "f32" || (last_row + 1) * width * 4 > size || width == 0 || rows == 0 {
            return Err(RuntimeError::Input(format!(
                "output '{name}' ({}{:?}) does not hold {rows} f32 rows of {width}, {step} apart from row {offset}",
                spec.dtype, spec.shape
            )));
        }
        let bad_draw = draws.iter().any(|u| !(0.0..1.0).contains(u));
        let (mode, k, p) = match draw {
            RowDraw::TopK(k) if k >= 1 => (1i32, k as u64, 1.0f64),
            RowDraw::TopP(p) if p > 0.0 && p <= 1.0 => (2, 0, p),
            _ => return Err(RuntimeError::Input(format!("{draw:?} is not a draw: k ≥ 1, 0 < p ≤ 1"))),
        };
        if draws.len() != rows || bad_draw || !(temperature > 0.0 && temperature.is_finite()) {
            return Err(RuntimeError::Input(format!(
                "{} draws in [0, 1) for {rows} rows, at temperature {temperature} (> 0)",
                draws.len()
            )));
        }
        let x = self.address(spec.location) + (offset * width * 4) as u64;
        let SampleKernels { plain, copying: with_copy, blocks, threads, optin, weights_apart } =
            self.sample_kernels()?;
        let function = if to.copying.is_some() { with_copy } else { plain };
        if self.state.draws.as_ref().is_none_or(|d| d.len() < rows) {
            self.state.draws = Some(self.stream.alloc_zeros::<f64>(rows).map_err(driver)?);
        }
        if self.state.weights.as_ref().is_none_or(|w| w.len() < rows * width) {
            self.state.weights = Some(self.stream.alloc_zeros::<f64>(rows * width).map_err(driver)?);
        }
        let (Some(on_device), Some(weights)) = (self.state.draws.as_mut(), self.state.weights.as_mut())
        else {
            return Err(RuntimeError::Driver("the sampling buffers were not allocated".into()));
        };
        // The draws: where the caller wrote them into mapped page-locked memory, read from
        // there; else copied to the device on the stream.
        let (host, draws_at) = match to.mapped {
            Some((ids, draws)) => (ids, draws),
            None => {
                self.stream.memcpy_htod(draws, &mut on_device.slice_mut(..rows)).map_err(driver)?;
                (0, on_device.device_ptr(&self.stream).0)
            }
        };
        // Each block's part of the row in shared memory where it fits beside the kernel's own
        // (~29 KB; 50,257 logits: 197 KB a block, 25 KB a block of a cluster), every pass of
        // the searches reading it there; and its weights after it (f64: 50 KB a block of a
        // cluster) where they fit too, unless `FUSEC_SAMPLE_SHARED_WEIGHTS=0`.
        let part = width.div_ceil(blocks);
        let (row_bytes, with_weights) = (part * 4, part.next_multiple_of(2) * 4 + part * 8);
        let own = function.shared_size_bytes().map_or(32 * 1024, |b| b.max(0) as usize);
        let candidates = [(2, with_weights), (1, row_bytes)];
        let (shared_row, dynamic) = candidates
            .into_iter()
            .filter(|&(mode, _)| mode == 1 || !weights_apart)
            .find(|&(_, bytes)| {
                bytes + own <= optin
                    && function
                        .set_attribute(
                            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            bytes as i32,
                        )
                        .is_ok()
            })
            .unwrap_or((0i32, 0));
        // The copy's blocks after the rows', in whole clusters: a block a word of each tensor
        // and then of the sets.
        let copy_blocks = to.copying.map_or(0, |c| c.blocks_at(threads));
        let copy_span =
            to.copying.map_or(0, |c| (c.blocks.1 as u64 * copy_blocks).next_multiple_of(blocks as u64));
        let grid = (rows * blocks) as u64 + copy_span;
        let config = LaunchConfig {
            grid_dim: (
                u32::try_from(grid).ok().filter(|&g| g < i32::MAX as u32).ok_or_else(|| {
                    RuntimeError::Input(format!("{rows} rows and a copy of {copy_span} blocks"))
                })?,
                1,
                1,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: dynamic as u32,
        };
        let (width, row_pitch) = (width as u64, (step * width) as u64);
        let rows_u = rows as u64;
        let mut args = self.stream.launch_builder(&function);
        args.arg(&x).arg(&to.out).arg(&host).arg(&width).arg(&row_pitch).arg(&draws_at).arg(&mut *weights);
        args.arg(&shared_row);
        args.arg(&mode).arg(&k).arg(&p).arg(&temperature);
        if let Some(copy) = to.copying {
            args.arg(&rows_u);
            copy.push(&mut args);
            args.arg(&copy_blocks);
        }
        // SAFETY: the kernel reads `rows` rows of `width` f32s, `row_pitch` apart, from the
        // output's buffer (checked above to hold them), and `rows` draws (the device's copy, or
        // the caller's mapped memory holding them); it writes `rows` ids at `to.out` and, where
        // mapped, at `host` (the caller checked both hold them) and `rows · width` weights into `weights`,
        // which hold at least that many. The copy and its sets are as `copy_rows` checked
        // them (`row_copy_launch`), in blocks of their own that touch none of that memory.
        unsafe { args.launch(config) }.map_err(driver)?;
        Ok(())
    }
}
