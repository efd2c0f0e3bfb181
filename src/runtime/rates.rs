//! What this GPU can do, measured: device-to-device copy bandwidth and the cuBLAS GEMM rate
//! in a given element type. `fusec bench` divides a model's bytes and FLOPs by them to get
//! the floor a run cannot beat.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaStream, DevicePtr};

use super::{blas, session::driver_available, RuntimeError};
use crate::codegen::{GemmOperand, GemmSpec};
use crate::ir::DType;
use crate::plan::Location;

fn driver(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Driver(format!("{e:?}"))
}

/// Measured rates of one GPU.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct DeviceRates {
    /// Bytes read plus bytes written per second by a large device-to-device copy.
    pub copy_bytes_per_s: f64,
    /// Floating-point operations per second of a large square cuBLAS GEMM (f32 accumulate).
    pub gemm_flops_per_s: f64,
    /// Element type of that GEMM.
    pub gemm_dtype: DType,
}

/// Median milliseconds of `reps` runs of `work` (after two untimed ones), CUDA events.
fn time(
    stream: &std::sync::Arc<CudaStream>,
    reps: usize,
    mut work: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    let ctx = stream.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver)?;
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        start.record(stream).map_err(driver)?;
        work()?;
        end.record(stream).map_err(driver)?;
        end.synchronize().map_err(driver)?;
        if i >= 2 {
            times.push(f64::from(start.elapsed_ms(&end).map_err(driver)?));
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Measures copy bandwidth (512 MiB copied) and the rate of an 8192³ GEMM in `dtype` (f32
/// storage for anything that is not f16/bf16) on GPU `device`. Takes about a second.
pub fn measure(device: usize, dtype: DType) -> Result<DeviceRates, RuntimeError> {
    if !driver_available() {
        return Err(RuntimeError::NoDriver);
    }
    let ctx = super::context(device)?;
    let stream = ctx.new_stream().map_err(driver)?;

    let bytes = 512usize << 20;
    let src = stream.alloc_zeros::<u8>(bytes).map_err(driver)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes).map_err(driver)?;
    let copy_ms = time(&stream, 10, || stream.memcpy_dtod(&src, &mut dst).map_err(driver))?;
    drop((src, dst));

    let dtype = if matches!(dtype, DType::F16 | DType::BF16) { dtype } else { DType::F32 };
    let n = 8192usize;
    // Non-zero operands: a repeating pattern of values in [-1, 1).
    let pattern: Vec<f32> =
        (0..4099u32).map(|i| ((i * 2_654_435_761) >> 8) as f32 / (1u32 << 23) as f32 - 1.0).collect();
    let encoded: Vec<u8> = pattern
        .iter()
        .flat_map(|&v| match dtype {
            DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        })
        .collect();
    // The pattern repeated over n² elements, built by whole copies of it (building it element
    // by element took seconds, longer than the measurement).
    let size = n * n * dtype.size_bytes();
    let mut host = Vec::with_capacity(size + encoded.len());
    while host.len() < size {
        host.extend_from_slice(&encoded);
    }
    host.truncate(size);
    let a = stream.clone_htod(&host).map_err(driver)?;
    let c = stream.alloc_zeros::<u8>(host.len()).map_err(driver)?;
    let cublas = blas::Blas::new(device, &stream)?;
    let operand =
        |offset| GemmOperand { location: Location::Arena(offset), transposed: false, batch_stride: 0 };
    let spec = GemmSpec {
        a: operand(0),
        b: operand(0),
        c: Location::Arena(0),
        m: n,
        n,
        k: n,
        batch: 1,
        alpha: 1.0,
        dtype,
        out: None,
        lt_epilogue: None,
        dims: None,
    };
    let addresses = (a.device_ptr(&stream).0, a.device_ptr(&stream).0, c.device_ptr(&stream).0);
    let gemm_ms = time(&stream, 10, || blas::gemm(cublas.handle()?, &spec, addresses))?;
    Ok(DeviceRates {
        copy_bytes_per_s: 2.0 * bytes as f64 / (copy_ms * 1e-3),
        gemm_flops_per_s: 2.0 * (n * n * n) as f64 / (gemm_ms * 1e-3),
        gemm_dtype: dtype,
    })
}
