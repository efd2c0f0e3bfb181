//! Whether a library GEMM's kernel waits for the kernel before it, found by running it so
//! ([`super::library_edges`] asks, once a process for each kernel it does not know). The
//! step's library call runs as the secondary of a programmatic edge from `kernels/wait_probe.cu`,
//! which lets it be scheduled at once but writes the call's inputs (A, B and the residual) only
//! after spinning for [`SPIN_NS`]; they hold zeros until then. A kernel that reads its inputs
//! before its wait computes from the zeros; one that waits computes what the same call gives on
//! those inputs run plainly, bit for bit, twice. Every region the probe writes (the inputs and
//! C, in the arena or the weights) is saved first and restored after.

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::launch::Loaded;
use super::library_edges::{programmatic_from_here, reached_kernel, record_probe};
use super::{driver, RuntimeError, Session};
use crate::codegen::GemmOperand;
use crate::ir::DType;

/// PTX of `kernels/wait_probe.cu` (see kernels/README.md).
const WAIT_PROBE_PTX: &str = include_str!("../../../kernels/wait_probe.ptx");

/// How long the probe kernel holds the inputs back: a GEMM of a session runs in microseconds.
const SPIN_NS: u64 = 200_000;

/// Blocks of the probe kernel: few enough to be resident at once on any GPU that has
/// programmatic launch, so that all of them have let the library's kernel be scheduled.
const PROBE_BLOCKS: u32 = 32;

impl Session {
    /// Probes each kernel the last capture reached that is not known yet, and records what it
    /// found. A kernel whose step is not found, or whose probe fails, counts as not waiting.
    pub(super) fn probe_pending_library_kernels(&self) {
        for (name, address) in self.library_edges.take_pending() {
            let step = self
                .steps
                .iter()
                .chain(self.sizes.iter().flat_map(|(_, steps, _)| steps))
                .find(|s| std::ptr::eq(*s, address as *const Loaded));
            let waits = match step.map(|s| self.probe_library_waits(s, &name)) {
                Some(Ok(waits)) => waits,
                Some(Err(e)) => {
                    tracing::debug!("probing library kernel {name} failed: {e}");
                    false
                }
                None => false,
            };
            tracing::debug!(kernel = name, waits, "library kernel probed");
            record_probe(&name, waits);
        }
    }

    /// Whether the library call of GEMM step `step`, whose kernel is `name`, waits for its
    /// predecessor (module docs). Leaves the session's memory as it found it.
    fn probe_library_waits(&self, step: &Loaded, name: &str) -> Result<bool, RuntimeError> {
        let Loaded::Gemm { gemm, .. } = step else { return Ok(false) };
        let elem = gemm.dtype.size_bytes();
        let c_bytes = gemm.batch * gemm.m * gemm.n * gemm.c_dtype().size_bytes();
        let mut inputs = vec![
            (
                self.address(gemm.a.location),
                operand_bytes(&gemm.a, gemm.m * gemm.k, gemm.batch) * elem,
                gemm.dtype,
            ),
            (
                self.address(gemm.b.location),
                operand_bytes(&gemm.b, gemm.k * gemm.n, gemm.batch) * elem,
                gemm.dtype,
            ),
        ];
        if let Some(residual) = gemm.lt_epilogue.and_then(|e| e.residual) {
            inputs.push((self.address(residual), c_bytes, gemm.c_dtype()));
        }
        if inputs.iter().any(|&(_, bytes, _)| bytes == 0 || bytes % 4 != 0) || c_bytes == 0 {
            return Ok(false);
        }
        let c = self.address(gemm.c);
        // Everything written is saved first; the inputs' patterns are random non-zero values.
        let regions: Vec<(u64, usize)> =
            inputs.iter().map(|&(at, bytes, _)| (at, bytes)).chain([(c, c_bytes)]).collect();
        let saved =
            regions.iter().map(|&(at, bytes)| self.copy_of(at, bytes)).collect::<Result<Vec<_>, _>>()?;
        let patterns = inputs
            .iter()
            .enumerate()
            .map(|(i, &(_, bytes, dtype))| {
                self.stream.clone_htod(&pattern(bytes, dtype, i as u64 + 1)).map_err(driver)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let outcome = self.probe_runs(step, name, &inputs, &patterns, c, c_bytes);
        for (&(at, bytes), copy) in regions.iter().zip(&saved) {
            self.copy_device(at, self.pointer(copy), bytes)?;
        }
        self.stream.synchronize().map_err(driver)?;
        outcome
    }

    /// The reference run and the two probed runs of the probe, their C compared.
    fn probe_runs(
        &self,
        step: &Loaded,
        name: &str,
        inputs: &[(u64, usize, DType)],
        patterns: &[CudaSlice<u8>],
        c: u64,
        c_bytes: usize,
    ) -> Result<bool, RuntimeError> {
        for (&(at, bytes, _), pattern) in inputs.iter().zip(patterns) {
            self.copy_device(at, self.pointer(pattern), bytes)?;
        }
        self.library_gemm(step)?;
        let reference = self.read_device(c, c_bytes)?;
        let module = self
            .stream
            .context()
            .load_module(cudarc::nvrtc::Ptx::from_src(WAIT_PROBE_PTX))
            .map_err(driver)?;
        let probe = module.load_function("fusec_wait_probe").map_err(driver)?;
        // Sources, targets and word counts of up to three regions, then the spin.
        let mut args = [0u64; 10];
        for (i, (&(at, bytes, _), pattern)) in inputs.iter().zip(patterns).enumerate() {
            args[3 * i..3 * i + 3].copy_from_slice(&[self.pointer(pattern), at, (bytes / 4) as u64]);
        }
        args[9] = SPIN_NS;
        for _ in 0..2 {
            for &(at, bytes, _) in inputs {
                // SAFETY: the region lies inside the session's memory (`address` of a step's
                // operand); the stream orders it.
                unsafe { sys::cuMemsetD8Async(at, 0, bytes, self.stream.cu_stream()) }
                    .result()
                    .map_err(driver)?;
            }
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(driver)?;
            let mut launch = self.stream.launch_builder(&probe);
            for arg in &args {
                launch.arg(arg);
            }
            let config =
                LaunchConfig { grid_dim: (PROBE_BLOCKS, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the kernel's ten parameters are these ten 64-bit values: for each region
            // a source and a target of `words` 4-byte words, both allocated that large.
            let launched = unsafe { launch.launch(config) }.map_err(driver);
            let primaries = launched.as_ref().ok().and_then(|_| programmatic_from_here(&self.stream));
            let called = self.library_gemm(step);
            let reached = primaries.as_deref().and_then(reached_kernel);
            let graph = self.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver);
            launched?;
            called?;
            let Some(graph) = graph? else { return Ok(false) };
            if reached.as_deref() != Some(name) {
                tracing::debug!(?reached, name, "the probe's call reached another kernel");
                return Ok(false);
            }
            graph.launch().map_err(driver)?;
            self.stream.synchronize().map_err(driver)?;
            if self.read_device(c, c_bytes)? != reference {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A new device buffer holding the `bytes` at `at`.
    fn copy_of(&self, at: u64, bytes: usize) -> Result<CudaSlice<u8>, RuntimeError> {
        // SAFETY: filled by the copy after it, in stream order, before any read.
        let copy = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(driver)?;
        self.copy_device(self.pointer(&copy), at, bytes)?;
        Ok(copy)
    }

    fn pointer(&self, slice: &CudaSlice<u8>) -> u64 {
        slice.device_ptr(&self.stream).0
    }

    /// Copies `bytes` from `from` to `to` on the stream.
    fn copy_device(&self, to: u64, from: u64, bytes: usize) -> Result<(), RuntimeError> {
        // SAFETY: both ranges are allocations of this context at least `bytes` long (the
        // session's memory, or a buffer made that large).
        unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, bytes, self.stream.cu_stream()) }
            .result()
            .map_err(driver)
    }

    /// The `bytes` at `at`, once the stream is done.
    fn read_device(&self, at: u64, bytes: usize) -> Result<Vec<u8>, RuntimeError> {
        self.stream.synchronize().map_err(driver)?;
        let mut host = vec![0u8; bytes];
        // SAFETY: `host` holds `bytes`; the device range is inside the session's memory, and
        // nothing is queued on the stream.
        unsafe { sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), at, bytes) }.result().map_err(driver)?;
        Ok(host)
    }
}

/// Elements an operand of `elements` a matrix spans over `batch` matrices.
fn operand_bytes(operand: &GemmOperand, elements: usize, batch: usize) -> usize {
    if batch > 1 && operand.batch_stride > 0 {
        (batch - 1) * operand.batch_stride + elements
    } else {
        elements
    }
}

/// `bytes` of random values of `dtype`, each of magnitude in [0.5, 1) with a random sign
/// (random bytes for another type).
fn pattern(bytes: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(bytes);
    while out.len() < bytes {
        let r = next();
        match dtype {
            DType::F16 => out.extend_from_slice(&((0x3800 | (r & 0x83ff)) as u16).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&((0x3f00 | (r & 0x807f)) as u16).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&((0x3f00_0000 | (r & 0x807f_ffff)) as u32).to_le_bytes()),
            _ => out.push(r as u8),
        }
    }
    out.truncate(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::pattern;
    use crate::ir::DType;

    #[test]
    fn probe_patterns_are_finite_and_nonzero() {
        let halves = pattern(64, DType::F16, 3);
        for pair in halves.chunks(2) {
            let v = half::f16::from_le_bytes([pair[0], pair[1]]).to_f32().abs();
            assert!((0.5..1.0).contains(&v), "{v}");
        }
        let bf = pattern(64, DType::BF16, 4);
        for pair in bf.chunks(2) {
            let v = half::bf16::from_le_bytes([pair[0], pair[1]]).to_f32().abs();
            assert!((0.5..1.0).contains(&v), "{v}");
        }
        let floats = pattern(64, DType::F32, 5);
        for quad in floats.chunks(4) {
            let v = f32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]).abs();
            assert!((0.5..1.0).contains(&v), "{v}");
        }
        assert_ne!(pattern(64, DType::F16, 1), pattern(64, DType::F16, 2));
    }
}
