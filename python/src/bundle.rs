//! Compiling a model and the bundles it gives: `compile`, `summarize` (what an ONNX file
//! declares, without compiling) and `Bundle` (load, save, what it takes and gives).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::{chain, BundleError, CompileError, InputError};
use fusec::bundle::{Bundle, BundleRange, IoSpec};
use fusec::import::{DeclaredDim, DeclaredInput, DimSpec, ImportOptions, InputSpec};
use fusec::ir::DType;
use fusec::CompileOptions;

/// A compiled model: what `compile` returns and a `Session` runs.
#[pyclass(name = "Bundle", module = "fusec._fusec", frozen)]
pub struct PyBundle {
    pub inner: Arc<Bundle>,
}

/// An input or output for Python: `name`, `dtype` and `shape`, each dim its size or the
/// expression of the bundle's ranges it follows (`"batch"`, `"batch*16"`).
pub fn io_dict<'py>(py: Python<'py>, spec: &IoSpec, ranges: &[BundleRange]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &spec.name)?;
    d.set_item("dtype", numpy_name(DType::from_name(&spec.dtype)))?;
    let shape = PyList::empty(py);
    match &spec.dims {
        Some(dims) if !ranges.is_empty() => {
            for (dim, &top) in dims.iter().zip(&spec.shape) {
                match dim.powers.iter().any(|&p| p > 0) {
                    true => shape.append(dim.display(ranges))?,
                    false => shape.append(top)?,
                }
            }
        }
        _ => {
            for &n in &spec.shape {
                shape.append(n)?;
            }
        }
    }
    d.set_item("shape", shape)?;
    // An input stored inside an output's buffer (a cache updated in place): that output.
    d.set_item("inside", spec.inside.as_ref().map(|i| i.output.clone()))?;
    Ok(d)
}

/// NumPy's name for an element type (`float32`).
pub fn numpy_name(dtype: Option<DType>) -> &'static str {
    match dtype {
        Some(DType::F32) => "float32",
        Some(DType::F16) => "float16",
        Some(DType::BF16) => "bfloat16",
        Some(DType::F64) => "float64",
        Some(DType::I64) => "int64",
        Some(DType::I32) => "int32",
        Some(DType::Bool) => "bool",
        None => "unknown",
    }
}

#[pymethods]
impl PyBundle {
    /// Reads a bundle file (`fusec compile`'s output).
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<PyBundle> {
        let bundle = py.detach(|| Bundle::load(&path)).map_err(|e| BundleError::new_err(chain(&e)))?;
        Ok(PyBundle { inner: Arc::new(bundle) })
    }

    /// Writes the bundle to `path`.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.inner.save(&path)).map_err(|e| BundleError::new_err(chain(&e)))
    }

    /// The inputs: a list of dicts with `name`, `dtype` (NumPy's name) and `shape` (ints,
    /// and the names of the dims a range bundle takes at run time).
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let h = &self.inner.header;
        h.inputs.iter().map(|s| io_dict(py, s, &h.ranges)).collect()
    }

    /// The outputs, as `inputs`.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let h = &self.inner.header;
        h.outputs.iter().map(|s| io_dict(py, s, &h.ranges)).collect()
    }

    /// The ranges of sizes it runs: `{dim: (low, high)}` (empty for one size).
    #[getter]
    fn ranges(&self) -> Vec<(String, (usize, usize))> {
        self.inner.header.ranges.iter().map(|r| (r.symbol.clone(), (r.low, r.high))).collect()
    }

    /// What was compiled: model, fused, precision, kernels, launches, gemm_calls, conv_calls
    /// (cuDNN convolutions), graph_breaks, arch (None: CUDA sources, compiled at load),
    /// weight_bytes, arena_bytes.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = &self.inner.header;
        let d = PyDict::new(py);
        d.set_item("model", &h.model)?;
        d.set_item("fused", h.fused)?;
        d.set_item("precision", h.precision.name())?;
        d.set_item("kernels", h.kernels)?;
        d.set_item("launches", h.launches)?;
        d.set_item("gemm_calls", h.gemm_calls)?;
        d.set_item("conv_calls", h.conv_calls())?;
        d.set_item("graph_breaks", h.graph_breaks)?;
        d.set_item("arch", h.arch.clone())?;
        d.set_item("weight_bytes", self.inner.weights.len())?;
        d.set_item("arena_bytes", h.arena_bytes)?;
        d.set_item("format_version", h.format_version)?;
        Ok(d)
    }

    /// The bundle file's bytes (what `save` writes).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let bytes = self.inner.to_bytes().map_err(|e| BundleError::new_err(chain(&e)))?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// A bundle from the bytes `to_bytes` gave.
    #[staticmethod]
    fn from_bytes(bytes: &[u8]) -> PyResult<PyBundle> {
        let bundle = Bundle::from_bytes(bytes, "<bytes>").map_err(|e| BundleError::new_err(chain(&e)))?;
        Ok(PyBundle { inner: Arc::new(bundle) })
    }

    fn __eq__(&self, other: &PyBundle) -> bool {
        self.inner == other.inner
    }

    fn __repr__(&self) -> String {
        let h = &self.inner.header;
        let ranges: Vec<String> = h.ranges.iter().map(|r| r.to_string()).collect();
        format!(
            "Bundle(model={:?}, precision={}, kernels={}, launches={}{})",
            h.model,
            h.precision,
            h.kernels,
            h.launches,
            if ranges.is_empty() { String::new() } else { format!(", ranges=[{}]", ranges.join(", ")) }
        )
    }
}

/// A dim value from Python: an int, a `(low, high)` range, or the sum of other dims named in
/// a string (`"past+seq"`).
fn dim_spec(symbol: &str, value: &Bound<'_, PyAny>) -> PyResult<DimSpec> {
    let text = if let Ok(n) = value.extract::<usize>() {
        format!("{symbol}={n}")
    } else if let Ok((low, high)) = value.extract::<(usize, usize)>() {
        format!("{symbol}={low}..{high}")
    } else if let Some(sum) = value.extract::<String>().ok().filter(|s| s.contains('+')) {
        format!("{symbol}={sum}")
    } else {
        return Err(InputError::new_err(format!(
            "dims['{symbol}'] must be a size, a (low, high) range or a sum of dims (\"past+seq\"), not {}",
            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        )));
    };
    text.parse::<DimSpec>().map_err(InputError::new_err)
}

/// The element type a `precision` argument names.
pub fn precision_named(precision: &str) -> PyResult<DType> {
    match precision {
        "fp32" | "f32" | "float32" => Ok(DType::F32),
        "fp16" | "f16" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        other => Err(InputError::new_err(format!("precision '{other}': use fp32, fp16 or bf16"))),
    }
}

/// Compiles an ONNX model; see `fusec.compile` for the arguments.
// The arguments are the Python function's keywords.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (model, dims=None, inputs=None, precision="fp32", fuse=true, arch="sm_90", progress=None, exact_gelu=false, cache_in_place=false))]
pub fn compile(
    py: Python<'_>,
    model: PathBuf,
    dims: Option<&Bound<'_, PyDict>>,
    inputs: Option<&Bound<'_, PyDict>>,
    precision: &str,
    fuse: bool,
    arch: &str,
    progress: Option<Py<PyAny>>,
    exact_gelu: bool,
    cache_in_place: bool,
) -> PyResult<PyBundle> {
    let mut dim_specs = Vec::new();
    for (symbol, value) in dims.into_iter().flat_map(|d| d.iter()) {
        dim_specs.push(dim_spec(&symbol.extract::<String>()?, &value)?);
    }
    // A decoder's mask length not given beside its cache's and the new tokens': their sum.
    let inferred = fusec::import::inferred_cache_sum_of(&model, &dim_specs);
    dim_specs.extend(inferred);
    let dim_specs = fusec::import::resolve_sums(dim_specs).map_err(InputError::new_err)?;
    let mut input_specs = Vec::new();
    for (name, shape) in inputs.into_iter().flat_map(|d| d.iter()) {
        let name: String = name.extract()?;
        let shape: Vec<usize> = shape.extract().map_err(|_| {
            InputError::new_err(format!("inputs['{name}'] must be a shape: a tuple of sizes"))
        })?;
        let text = format!("{name}:{}", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x"));
        input_specs.push(text.parse::<InputSpec>().map_err(InputError::new_err)?);
    }
    let precision = precision_named(precision)?;
    let options = CompileOptions {
        import: ImportOptions::new(input_specs, dim_specs),
        no_fuse: !fuse,
        arch: Some(arch.to_string()),
        precision,
        exact_gelu: exact_gelu || CompileOptions::default().exact_gelu,
        cache_in_place,
        ..Default::default()
    };
    let bundle = py.detach(|| {
        let clock = std::time::Instant::now();
        let mut last = 0.0;
        let mut report = |stage: &'static str| {
            let now = clock.elapsed().as_secs_f64();
            if let Some(callback) = &progress {
                Python::attach(|py| {
                    if let Err(e) = callback.call1(py, (stage, now - last)) {
                        e.write_unraisable(py, None);
                    }
                });
            }
            last = now;
        };
        fusec::compile_reporting(&model, &options, &mut report)
    });
    let bundle = bundle.map_err(|e| CompileError::new_err(chain(&e)))?;
    Ok(PyBundle { inner: Arc::new(bundle) })
}

fn declared_dict<'py>(py: Python<'py>, value: &DeclaredInput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &value.name)?;
    d.set_item("dtype", numpy_name(value.dtype))?;
    match &value.dims {
        None => d.set_item("shape", py.None())?,
        Some(dims) => {
            let shape = PyList::empty(py);
            for dim in dims {
                match dim {
                    DeclaredDim::Fixed(n) => shape.append(n)?,
                    DeclaredDim::Symbolic(s) => shape.append(s)?,
                    DeclaredDim::Unknown => shape.append(py.None())?,
                }
            }
            d.set_item("shape", shape)?;
        }
    }
    Ok(d)
}

/// What an ONNX file declares, without compiling it: `inputs` and `outputs` (dicts of
/// `name`, `dtype`, `shape` with ints, dim names and None), `opset`, `producer`, `nodes`,
/// `unsupported` (the ops fusec cannot import, by node).
#[pyfunction]
pub fn summarize<'py>(py: Python<'py>, model: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let summary =
        py.detach(|| fusec::import::summarize(&model)).map_err(|e| CompileError::new_err(chain(&e)))?;
    let d = PyDict::new(py);
    let inputs: Vec<_> = summary.inputs.iter().map(|i| declared_dict(py, i)).collect::<PyResult<_>>()?;
    let outputs: Vec<_> =
        summary.declared_outputs.iter().map(|o| declared_dict(py, o)).collect::<PyResult<_>>()?;
    d.set_item("inputs", inputs)?;
    d.set_item("outputs", outputs)?;
    d.set_item("opset", summary.opset)?;
    d.set_item("producer", summary.producer)?;
    d.set_item("nodes", summary.node_count)?;
    let unsupported: Vec<(String, String)> =
        summary.unsupported.iter().map(|u| (u.node.clone(), u.op_type.clone())).collect();
    d.set_item("unsupported", unsupported)?;
    Ok(d)
}

/// Each output's dims that are fixed whatever the sizes of the inputs' named dims (None for
/// the others), as tract infers them from the graph.
#[pyfunction]
pub fn fixed_output_dims(py: Python<'_>, model: PathBuf) -> PyResult<Vec<Vec<Option<usize>>>> {
    py.detach(|| fusec::import::fixed_output_dims(&model)).map_err(CompileError::new_err)
}
