//! Generating tokens from Python (`fusec.Generator`): a decoder exported with its key/value
//! cache, compiled the way `fusec generate` compiles it (`fusec::generate::compile`), or step
//! bundles loaded; on a GPU, or on the CPU through tract (`device="cpu"`, the reference).

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::bundle::{precision_named, PyBundle};
use crate::errors::{chain, runtime, CompileError, InputError};
use fusec::generate::reference::TractSteps;
use fusec::generate::{GenerateError, GenerateOptions, Generation, Generator, Sampling, StepCompile};
use fusec::Session;

/// Where the steps run.
enum Steps {
    Gpu(Box<Generator<Session>>),
    Cpu(Box<Generator<TractSteps>>),
}

impl Steps {
    fn layout(&self) -> &fusec::generate::CacheLayout {
        match self {
            Steps::Gpu(g) => g.layout(),
            Steps::Cpu(g) => g.layout(),
        }
    }

    fn prompt_length(&self) -> Option<usize> {
        match self {
            Steps::Gpu(g) => g.prompt_length(),
            Steps::Cpu(g) => g.prompt_length(),
        }
    }
}

/// A generator that moves between threads with its Python object, used by one at a time.
struct Moving(Steps);

impl Moving {
    /// [`Generator::generate`] on the GPU (its context made current on the calling thread
    /// first) or on the CPU. A method, so that a closure calling it captures the whole
    /// `Moving`, which is `Send`.
    fn generate(
        &mut self,
        prompts: &[Vec<i64>],
        options: &GenerateOptions,
        on_token: impl FnMut(usize, i64),
    ) -> Result<Generation, GenerateError> {
        match &mut self.0 {
            Steps::Gpu(g) => {
                g.steps_mut().bind_to_thread()?;
                g.generate(prompts, options, on_token)
            }
            Steps::Cpu(g) => g.generate(prompts, options, on_token),
        }
    }
}

// SAFETY: as for `session::Moving`: a GPU generator's sessions (context, stream, modules,
// graphs, library handles) may be used from any thread, one at a time; pyo3 lends the object
// mutably to one thread at a time, and `generate` makes the sessions' context current on the
// calling thread first. A CPU generator holds host tensors only.
unsafe impl Send for Moving {}

// SAFETY: shared references reach only the layout and the prompt length (plain data), never
// a CUDA call; a generation borrows the object mutably.
unsafe impl Sync for Moving {}

/// Python's error for a generation's failure.
fn generate_error(e: GenerateError) -> PyErr {
    match e {
        GenerateError::Runtime(e) => runtime(e),
        e @ GenerateError::Compile { .. } => CompileError::new_err(chain(&e)),
        e => InputError::new_err(e.to_string()),
    }
}

/// The device a `device` argument names: `"cpu"` (None: the CPU), or an int, `"cuda"` or
/// `"cuda:N"` (that GPU).
fn device_named(device: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if let Ok(n) = device.extract::<usize>() {
        return Ok(Some(n));
    }
    let text: String = device.extract().map_err(|_| {
        InputError::new_err("device must be a GPU index, \"cuda\", \"cuda:N\" or \"cpu\"".to_string())
    })?;
    match text.as_str() {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        other => other.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(Some).ok_or_else(|| {
            InputError::new_err(format!("device {other:?}: use a GPU index, \"cuda:N\" or \"cpu\""))
        }),
    }
}

/// What `Generator.generate` made: `tokens` (the tokens generated after each prompt),
/// `steps` (steps run), `first_token_ms` (from the call until every sequence had its first
/// token), `ms_per_token` (the median step after that), `tokens_per_second` (all sequences)
/// and `step_ms` (each step after the first tokens).
#[pyclass(name = "Generation", module = "fusec._fusec", get_all, frozen)]
pub struct PyGeneration {
    /// The tokens generated after each prompt, in order.
    tokens: Vec<Vec<i64>>,
    /// Steps run (each one token of every sequence).
    steps: usize,
    /// From the call until every sequence had its first token, in ms.
    first_token_ms: f64,
    /// Median ms a step after the first tokens.
    ms_per_token: f64,
    /// Tokens a second over those steps, all sequences together.
    tokens_per_second: f64,
    /// Each step after the first tokens, in ms.
    step_ms: Vec<f64>,
}

#[pymethods]
impl PyGeneration {
    fn __repr__(&self) -> String {
        format!(
            "Generation({} sequence{}, {} steps, first tokens {:.2} ms, {:.3} ms a token)",
            self.tokens.len(),
            if self.tokens.len() == 1 { "" } else { "s" },
            self.steps,
            self.first_token_ms,
            self.ms_per_token
        )
    }
}

impl PyGeneration {
    fn of(generation: Generation, sequences: usize) -> Self {
        PyGeneration {
            ms_per_token: generation.ms_per_token(),
            tokens_per_second: generation.tokens_per_second(sequences),
            tokens: generation.tokens,
            steps: generation.steps,
            first_token_ms: generation.first_token_ms,
            step_ms: generation.step_ms,
        }
    }
}

/// A decoder exported with its key/value cache (inputs `input_ids`, `attention_mask`,
/// `position_ids`, `past_key_values.{i}.key|value`; outputs `logits`, `present.{i}.key|value`),
/// compiled for `batch` sequences and a cache of `capacity` positions and loaded on a GPU
/// (`device`: an index or "cuda:N") or kept on the CPU (`device="cpu"`: run by tract, the
/// reference); `prompt_tokens` (2 or more) adds a step that runs that many tokens of every
/// prompt at once. `Generator.from_bundles` loads step bundles compiled before. The cache
/// stays on the device; greedy choice and top-k / top-p draws run there, and only token ids
/// come back.
#[pyclass(name = "Generator", module = "fusec._fusec")]
pub struct PyGenerator {
    inner: Moving,
    device: Option<usize>,
}

#[pymethods]
impl PyGenerator {
    /// Compiles `model` (ONNX) for `batch` sequences and a cache of `capacity` positions,
    /// and a prompt step of `prompt_tokens` tokens where given (2 or more), then loads it on
    /// `device` (or keeps it on the CPU, run by tract).
    // The arguments are the Python constructor's keywords.
    #[allow(clippy::too_many_arguments)]
    #[new]
    #[pyo3(signature = (model, batch=1, capacity=256, precision="fp32", prompt_tokens=None, device=None, fuse=true))]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        batch: usize,
        capacity: usize,
        precision: &str,
        prompt_tokens: Option<usize>,
        device: Option<&Bound<'_, PyAny>>,
        fuse: bool,
    ) -> PyResult<Self> {
        let device = match device {
            Some(d) => device_named(d)?,
            None => Some(0),
        };
        let how = StepCompile {
            batch,
            capacity,
            precision: precision_named(precision)?,
            no_fuse: !fuse,
            prompt: prompt_tokens,
        };
        let inner = py
            .detach(|| match device {
                Some(gpu) => {
                    Generator::compile(&model, &how, gpu).map(|(g, _)| Moving(Steps::Gpu(Box::new(g))))
                }
                None => Generator::compile_on_cpu(&model, &how).map(|g| Moving(Steps::Cpu(Box::new(g)))),
            })
            .map_err(generate_error)?;
        Ok(PyGenerator { inner, device })
    }

    /// A generator of bundles compiled before: `step` (one token a sequence, `past` the
    /// cache's capacity) and optionally `prompt` (the same decoder for a prompt step), on GPU
    /// `device`.
    #[staticmethod]
    #[pyo3(signature = (step, prompt=None, device=0))]
    fn from_bundles(
        py: Python<'_>,
        step: Py<PyBundle>,
        prompt: Option<Py<PyBundle>>,
        device: usize,
    ) -> PyResult<Self> {
        let step = step.get().inner.clone();
        let prompt = prompt.map(|p| p.get().inner.clone());
        let inner = py
            .detach(|| {
                match &prompt {
                    Some(prompt) => Generator::with_prompt(&step, prompt, device),
                    None => Generator::new(&step, device),
                }
                .map(|g| Moving(Steps::Gpu(Box::new(g))))
            })
            .map_err(generate_error)?;
        Ok(PyGenerator { inner, device: Some(device) })
    }

    /// Sequences a step runs: at most this many prompts a call.
    #[getter]
    fn batch(&self) -> usize {
        self.inner.0.layout().batch
    }

    /// Positions the cache holds (a prompt and its new tokens together, less one).
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.0.layout().capacity
    }

    /// Logits a token.
    #[getter]
    fn vocab(&self) -> usize {
        self.inner.0.layout().vocab
    }

    /// Tokens of the prompt step (None without one).
    #[getter]
    fn prompt_tokens(&self) -> Option<usize> {
        self.inner.0.prompt_length()
    }

    /// The GPU index, or "cpu".
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.device {
            Some(n) => n.into_pyobject(py)?.into_any().unbind(),
            None => "cpu".into_pyobject(py)?.into_any().unbind(),
        })
    }

    /// Generates up to `max_new_tokens` after each prompt (a list of token ids, or a list of
    /// such lists, at most `batch`); `sample` is "greedy", "top-k=K" or "top-p=P";
    /// `on_token(sequence, token)` is called as each token is chosen.
    // The arguments are the Python method's keywords.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (prompts, max_new_tokens=16, sample="greedy", temperature=1.0, seed=0, stop=None, on_token=None))]
    fn generate(
        &mut self,
        py: Python<'_>,
        prompts: &Bound<'_, PyAny>,
        max_new_tokens: usize,
        sample: &str,
        temperature: f64,
        seed: u64,
        stop: Option<i64>,
        on_token: Option<Py<PyAny>>,
    ) -> PyResult<PyGeneration> {
        let prompts: Vec<Vec<i64>> = match prompts.extract::<Vec<Vec<i64>>>() {
            Ok(many) => many,
            Err(_) => vec![prompts.extract::<Vec<i64>>().map_err(|_| {
                InputError::new_err(
                    "prompts must be a list of token ids, or a list of such lists".to_string(),
                )
            })?],
        };
        let sampling: Sampling = sample.parse().map_err(InputError::new_err)?;
        let options = GenerateOptions { max_new_tokens, sampling, temperature, seed, stop };
        let inner = &mut self.inner;
        let mut failed: Option<PyErr> = None;
        let generation = py.detach(|| {
            let mut stream = |sequence: usize, token: i64| {
                if let (Some(callback), None) = (&on_token, &failed) {
                    Python::attach(|py| {
                        if let Err(e) = callback.call1(py, (sequence, token)) {
                            failed = Some(e);
                        }
                    });
                }
            };
            inner.generate(&prompts, &options, &mut stream)
        });
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(PyGeneration::of(generation.map_err(generate_error)?, prompts.len()))
    }

    fn __repr__(&self) -> String {
        let layout = self.inner.0.layout();
        let device = self.device.map_or_else(|| "cpu".to_string(), |n| format!("cuda:{n}"));
        let prompt = self.inner.0.prompt_length().map_or_else(|| "None".to_string(), |p| p.to_string());
        format!(
            "Generator(batch={}, capacity={}, vocab={}, prompt_tokens={prompt}, device={device})",
            layout.batch, layout.capacity, layout.vocab
        )
    }
}
