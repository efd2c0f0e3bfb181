//! A bundle loaded on a GPU, for Python: host arrays in and out (`run_host_outputs`), device
//! tensors in and out in order with the caller's stream (`run_device`), the session's own
//! input buffers lent out for writing in place, and the Rust API timed from the same
//! process (`time_rust_run`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::HostArray;
use crate::bundle::{io_dict, numpy_name, PyBundle};
use crate::dlpack;
use crate::errors::{runtime, InputError};
use crate::output::HostOutput;
use fusec::ir::DType;
use fusec::runtime::{DeviceInput, HostInput, SessionOptions};
use fusec::Session;

/// A session that moves between threads with its Python object, used by one at a time.
struct Moving(Session);

impl Moving {
    /// The session, made current on the calling thread (a closure that calls this captures
    /// the whole `Moving`, which is `Send`).
    fn bound(&mut self) -> Result<&mut Session, fusec::runtime::RuntimeError> {
        self.0.bind_to_thread()?;
        Ok(&mut self.0)
    }
}

// SAFETY: a session's CUDA objects (context, stream, modules, graphs, cuBLAS and cuDNN
// handles) may be used from any thread, one at a time: pyo3 lends the object mutably to one
// thread at a time, and every call below first makes the session's context current on the
// calling thread (`bind_to_thread`).
unsafe impl Send for Moving {}

// SAFETY: shared references reach only what `&Session` methods read (specs, addresses,
// names), never CUDA calls; pyo3's borrow flag keeps them from overlapping a run, which
// borrows the object mutably.
unsafe impl Sync for Moving {}

/// A bundle loaded on one GPU; see `fusec.Session`.
#[pyclass(name = "Session", module = "fusec._fusec")]
pub struct PySession {
    session: Moving,
    bundle: Py<PyBundle>,
    device: usize,
    /// Seconds the Rust API's part of the last `run_host_outputs` took (the run and the
    /// output copies, without the binding around them).
    last_rust_s: f64,
}

/// Output `k` of the last run copied to the host: into page-locked memory from the session's
/// pool where it is large (the copy lands there directly), else into new memory.
enum Copied {
    Pinned(fusec::runtime::PinnedOutput),
    Words(Vec<u64>, usize),
}

fn copy_output(session: &Session, k: usize) -> Result<Copied, fusec::runtime::RuntimeError> {
    Ok(match session.output_pinned(k)? {
        Some(pinned) => Copied::Pinned(pinned),
        None => {
            let (words, len) = session.output_words(k)?;
            Copied::Words(words, len)
        }
    })
}

/// Whether a CUDA driver (libcuda) can be loaded on this machine.
#[pyfunction]
pub fn cuda_available() -> bool {
    fusec::runtime::driver_available()
}

/// Whether NVRTC can be loaded (compiles PTX into bundles; without it, bundles keep CUDA
/// sources and the runtime compiles them at load).
#[pyfunction]
pub fn nvrtc_available() -> bool {
    fusec::nvrtc::available()
}

/// The inputs of a feed, each read in place from its array.
fn host_inputs<'a>(feed: &'a [(String, Bound<'_, PyAny>)], arrays: &'a [HostArray]) -> Vec<HostInput<'a>> {
    feed.iter()
        .zip(arrays)
        .map(|((name, _), a)| HostInput { name, dtype: a.dtype, shape: &a.shape, bytes: a.bytes() })
        .collect()
}

pub fn dtype_named(name: &str) -> PyResult<DType> {
    [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32, DType::Bool]
        .into_iter()
        .find(|&d| numpy_name(Some(d)) == name)
        .ok_or_else(|| InputError::new_err(format!("element type '{name}' is not one fusec takes")))
}

#[pymethods]
impl PySession {
    /// Loads `bundle` on GPU `device`.
    #[new]
    #[pyo3(signature = (bundle, device=0, cuda_graph=true, tune_gemms=true))]
    fn new(
        py: Python<'_>,
        bundle: Py<PyBundle>,
        device: usize,
        cuda_graph: bool,
        tune_gemms: bool,
    ) -> PyResult<Self> {
        let options = SessionOptions { cuda_graph, tune_gemms, ..Default::default() };
        let inner = bundle.get().inner.clone();
        let session =
            py.detach(|| Session::with_options(&inner, device, options).map(Moving)).map_err(runtime)?;
        Ok(PySession { session, bundle, device, last_rust_s: 0.0 })
    }

    /// The bundle it runs.
    #[getter]
    fn bundle(&self, py: Python<'_>) -> Py<PyBundle> {
        self.bundle.clone_ref(py)
    }

    /// The GPU index.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// The GPU's name.
    #[getter]
    fn device_name(&self) -> String {
        self.session.0.device_name.clone()
    }

    /// The inputs (as `Bundle.inputs`).
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let ranges = &self.bundle.get().inner.header.ranges;
        self.session.0.inputs().iter().map(|s| io_dict(py, s, ranges)).collect()
    }

    /// The outputs (as `Bundle.outputs`).
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let ranges = &self.bundle.get().inner.header.ranges;
        self.session.0.outputs().iter().map(|s| io_dict(py, s, ranges)).collect()
    }

    /// Kernel launches and library calls per run, as loaded.
    #[getter]
    fn launches(&self) -> usize {
        self.session.0.launches()
    }

    /// Seconds the Rust API's part of the last `run_host_outputs` took: the session's run and
    /// the output copies (`Session::run_host_on_device`, `Session::output_pinned` or `output_words`), timed inside
    /// the call, so that a caller's wall time of the same call less this is what Python and
    /// the binding added to it (`benches/python_api.py`).
    #[getter]
    fn last_rust_seconds(&self) -> f64 {
        self.last_rust_s
    }

    /// Runs on host arrays, `[(name, array)]` (C-contiguous, each of its input's type, read in
    /// place), then copies each output wanted (all when None; by index) from the device once,
    /// into a `HostOutput` that `numpy.asarray` turns into an array in place: the Rust API's
    /// own work (one copy, into page-locked memory from the session's pool for an output of
    /// `PINNED_MIN_BYTES` or more, else into new memory), no more.
    #[pyo3(signature = (feed, wanted=None))]
    fn run_host_outputs(
        &mut self,
        py: Python<'_>,
        feed: Vec<(String, Bound<'_, PyAny>)>,
        wanted: Option<Vec<usize>>,
    ) -> PyResult<Vec<HostOutput>> {
        let arrays = feed.iter().map(|(name, a)| HostArray::new(a, name)).collect::<PyResult<Vec<_>>>()?;
        let inputs = host_inputs(&feed, &arrays);
        let (session, last_rust_s) = (&mut self.session, &mut self.last_rust_s);
        py.detach(|| {
            let start = std::time::Instant::now();
            let session = session.bound()?;
            let types = session.run_host_on_device(&inputs)?;
            let wanted = wanted.unwrap_or_else(|| (0..types.len()).collect());
            let mut outputs = Vec::with_capacity(wanted.len());
            for k in wanted {
                let Some(t) = types.get(k) else {
                    return Err(fusec::runtime::RuntimeError::Input(format!("no output {k}")));
                };
                let Some(format) = crate::output::format_of(t.dtype) else {
                    return Err(fusec::runtime::RuntimeError::Input(format!(
                        "output {k} is {}, which NumPy has no type for: take it with run_torch",
                        numpy_name(Some(t.dtype))
                    )));
                };
                outputs.push(match copy_output(session, k)? {
                    Copied::Pinned(pinned) => HostOutput::from_pinned(pinned, t.dtype, format, &t.shape),
                    Copied::Words(words, len) => {
                        HostOutput::from_words(words, len, t.dtype, format, &t.shape)
                    }
                });
            }
            *last_rust_s = start.elapsed().as_secs_f64();
            Ok(outputs)
        })
        .map_err(runtime)
    }

    /// Runs on device tensors, `[(name, address, dtype, shape)]`, in order with CUDA stream
    /// `stream` (a handle; 0 for the legacy default stream); returns `(name, capsule)` for
    /// every output: DLPack capsules of the session's buffers, valid until the next run.
    fn run_device(
        slf: &Bound<'_, Self>,
        feed: Vec<(String, u64, String, Vec<usize>)>,
        stream: u64,
    ) -> PyResult<Vec<(String, Py<PyAny>)>> {
        let py = slf.py();
        let dtypes = feed.iter().map(|(_, _, d, _)| dtype_named(d)).collect::<PyResult<Vec<_>>>()?;
        let inputs: Vec<DeviceInput> = feed
            .iter()
            .zip(&dtypes)
            .map(|((name, address, _, shape), &dtype)| DeviceInput { name, dtype, shape, address: *address })
            .collect();
        let outputs = {
            let mut this = slf.borrow_mut();
            let session = &mut this.session;
            py.detach(|| session.bound()?.run_device(&inputs, stream)).map_err(runtime)?
        };
        let device = slf.borrow().device;
        outputs
            .into_iter()
            .map(|o| {
                let owner = slf.clone().into_any().unbind();
                let capsule = dlpack::capsule(py, o.address, device, o.ty.dtype, &o.ty.shape, owner)?;
                Ok((o.name, capsule))
            })
            .collect()
    }

    /// Runs on DLPack capsules, `[(name, capsule)]` (CUDA tensors of this GPU, compact,
    /// borrowed for the call), in order with CUDA stream `stream`; returns the outputs'
    /// `(name, dtype, shape)`: read them with `output_buffer`, valid until the next run.
    fn run_dlpack(
        &mut self,
        py: Python<'_>,
        feed: Vec<(String, Bound<'_, PyAny>)>,
        stream: u64,
    ) -> PyResult<Vec<(String, &'static str, Vec<usize>)>> {
        let borrowed = feed
            .iter()
            .map(|(name, capsule)| dlpack::borrow(capsule, name, self.device))
            .collect::<PyResult<Vec<_>>>()?;
        let inputs: Vec<DeviceInput> = feed
            .iter()
            .zip(&borrowed)
            .map(|((name, _), b)| DeviceInput { name, dtype: b.dtype, shape: &b.shape, address: b.address })
            .collect();
        let session = &mut self.session;
        let outputs = py.detach(|| session.bound()?.run_device(&inputs, stream)).map_err(runtime)?;
        Ok(outputs.into_iter().map(|o| (o.name, numpy_name(Some(o.ty.dtype)), o.ty.shape)).collect())
    }

    /// A DLPack capsule of output `name` as the last run left it (its shape at that run's
    /// point), the session's own buffer: valid until the next run.
    fn output_buffer(slf: &Bound<'_, Self>, name: &str) -> PyResult<Py<PyAny>> {
        let this = slf.borrow();
        let session = &this.session.0;
        let spec = session.outputs().iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = session.outputs().iter().map(|s| s.name.as_str()).collect();
            InputError::new_err(format!("the model has no output '{name}' (it has {})", names.join(", ")))
        })?;
        let dtype = DType::from_name(&spec.dtype)
            .ok_or_else(|| InputError::new_err(format!("output '{name}': {}", spec.dtype)))?;
        let shape = spec.shape_at(session.point());
        let address = session.output_device_ptr(name).map_or(0, |(a, _)| a);
        let owner = slf.clone().into_any().unbind();
        dlpack::capsule(slf.py(), address, this.device, dtype, &shape, owner)
    }

    /// A DLPack capsule of the session's own buffer for input `name`, seen as `shape` (the
    /// input's shape at a point of the bundle's ranges; default: at the top of them): what is
    /// written there is read in place by `run_device`, with no copy.
    #[pyo3(signature = (name, shape=None))]
    fn input_buffer(slf: &Bound<'_, Self>, name: &str, shape: Option<Vec<usize>>) -> PyResult<Py<PyAny>> {
        let this = slf.borrow();
        let session = &this.session.0;
        let spec = session.inputs().iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = session.inputs().iter().map(|s| s.name.as_str()).collect();
            InputError::new_err(format!("the model has no input '{name}' (it has {})", names.join(", ")))
        })?;
        let ty = spec
            .tensor_type()
            .ok_or_else(|| InputError::new_err(format!("input '{name}': {}", spec.dtype)))?;
        let shape = shape.unwrap_or_else(|| ty.shape.clone());
        let fits = shape.len() == ty.shape.len() && shape.iter().zip(&ty.shape).all(|(a, b)| a <= b);
        if !fits {
            return Err(InputError::new_err(format!(
                "input '{name}' holds at most {:?}, not {shape:?}",
                ty.shape
            )));
        }
        let address = session.input_address(name).ok_or_else(|| {
            InputError::new_err(format!(
                "input '{name}' is stored inside an output (a cache updated in place): it has no buffer of its own"
            ))
        })?;
        let owner = slf.clone().into_any().unbind();
        dlpack::capsule(slf.py(), address, this.device, ty.dtype, &shape, owner)
    }

    /// The device address of input `name`'s buffer.
    fn input_address(&self, name: &str) -> Option<u64> {
        self.session.0.input_address(name)
    }

    /// The device address of output `name`'s buffer.
    fn output_address(&self, name: &str) -> Option<u64> {
        self.session.0.output_device_ptr(name).map(|(address, _)| address)
    }

    /// Seconds of each of `iters` runs of the Rust API on `feed`, after one run (unless not
    /// `warmup`): what the
    /// Python layer's overhead is measured against. `raw`: `Session::run_host_on_device` on
    /// the arrays' bytes with each output copied from the device as `run_host_outputs` copies it
    /// (what `Session.run` does
    /// below Python; only the outputs at indices `wanted` when given); else `Session::run`
    /// (host tensors in and out).
    #[pyo3(signature = (feed, iters, raw=false, warmup=true, wanted=None))]
    fn time_rust_run(
        &mut self,
        py: Python<'_>,
        feed: Vec<(String, Bound<'_, PyAny>)>,
        iters: usize,
        raw: bool,
        warmup: bool,
        wanted: Option<Vec<usize>>,
    ) -> PyResult<Vec<f64>> {
        let arrays = feed.iter().map(|(name, a)| HostArray::new(a, name)).collect::<PyResult<Vec<_>>>()?;
        let inputs = host_inputs(&feed, &arrays);
        let tensors = inputs
            .iter()
            .map(|i| Ok((i.name.to_string(), fusec::runtime::tensor_from_bytes(i.bytes, i.shape, i.dtype)?)))
            .collect::<Result<Vec<_>, fusec::runtime::RuntimeError>>()
            .map_err(runtime)?;
        let session = &mut self.session;
        py.detach(|| {
            let session = session.bound()?;
            let mut once = || -> Result<(), fusec::runtime::RuntimeError> {
                if raw {
                    let types = session.run_host_on_device(&inputs)?;
                    for k in wanted.clone().unwrap_or_else(|| (0..types.len()).collect()) {
                        // As `run_host_outputs` copies it.
                        drop(std::hint::black_box(copy_output(session, k)?));
                    }
                } else {
                    std::hint::black_box(session.run(&tensors)?);
                }
                Ok(())
            };
            if warmup {
                once()?;
            }
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                let start = std::time::Instant::now();
                once()?;
                times.push(start.elapsed().as_secs_f64());
            }
            Ok(times)
        })
        .map_err(runtime)
    }
}
