//! A decoder with a cache compiled for generation from its ONNX file: the one-token step for
//! a cache of some capacity and, for prompts of two tokens or more, the prompt step ([`super::prompt`])
//! — what `fusec generate`, `fusec bench --decode` and the Python package's `Generator`
//! compile, and the generators made of them, on a GPU or on the CPU (tract).

use std::path::Path;

use super::reference::TractSteps;
use super::{cache, CacheLayout, GenerateError, Generator};
use crate::bundle::Bundle;
use crate::import::{DeclaredDim, ImportOptions, InputSpec};
use crate::ir::DType;
use crate::pipeline::CompileOptions;
use crate::runtime::Session;

/// Cached positions of the prompt step's compile: one, masked out, so that its attention and
/// its cache are the prompt's own, not the capacity's (a dim takes no size 0).
pub const PROMPT_CACHE: usize = 1;

/// How a decoder is compiled for generation.
#[derive(Clone, Debug)]
pub struct StepCompile {
    /// Sequences a step runs: at most this many prompts a generation.
    pub batch: usize,
    /// Positions the cache holds: a prompt and its generated tokens together, less one.
    pub capacity: usize,
    /// Element type of weights and activations.
    pub precision: DType,
    /// One kernel an op, no fusion (the baseline `bench --decode` compares with).
    pub no_fuse: bool,
    /// Tokens of the prompt step (used for prompts at least this long); none below 2.
    pub prompt: Option<usize>,
}

/// Whether the decoder's cache is compiled to be updated in place (`--cache-in-place`): yes
/// unless `FUSEC_CACHE_IN_PLACE=0` (the copy of the whole cache each step, for comparison).
pub fn cache_in_place() -> bool {
    std::env::var("FUSEC_CACHE_IN_PLACE").map_or(true, |v| v.trim() != "0")
}

/// The shapes of `model` for `batch` sequences of `seq` tokens after `capacity` cached
/// positions (one decoding step: `seq` 1; a prompt step: more): `[batch, seq]` ids and
/// positions, `[batch, capacity + seq]` mask, cache inputs with `past` = `capacity` (heads
/// and head size as the model declares them).
pub fn prompt_inputs(
    model: &Path,
    batch: usize,
    seq: usize,
    capacity: usize,
) -> Result<Vec<InputSpec>, GenerateError> {
    let summary = crate::import::summarize(model).map_err(|e| GenerateError::Compile {
        // The import error names the file.
        what: "reading the model".into(),
        source: Box::new(e.into()),
    })?;
    summary
        .inputs
        .iter()
        .map(|input| {
            let shape = match input.name.as_str() {
                cache::TOKENS | cache::POSITIONS => vec![batch, seq],
                cache::MASK => vec![batch, capacity + seq],
                name if name.starts_with("past") => {
                    let fixed = |d: Option<&DeclaredDim>| match d {
                        Some(DeclaredDim::Fixed(n)) => Some(*n),
                        _ => None,
                    };
                    let dims = input.dims.as_deref().unwrap_or_default();
                    match (dims.len(), fixed(dims.get(1)), fixed(dims.get(3))) {
                        (4, Some(heads), Some(size)) => vec![batch, heads, capacity, size],
                        _ => {
                            return Err(GenerateError::Layout(format!(
                                "{}: cache input '{name}' is not [batch, heads, past, head_dim] with fixed heads and \
                                 head size",
                                model.display()
                            )))
                        }
                    }
                }
                other => {
                    return Err(GenerateError::Layout(format!(
                        "{}: input '{other}' is not one a decoder with a cache takes ({}, {}, {}, past_key_values.*)",
                        model.display(),
                        cache::TOKENS,
                        cache::MASK,
                        cache::POSITIONS
                    )))
                }
            };
            Ok(InputSpec { name: input.name.clone(), shape, dtype: input.dtype })
        })
        .collect()
}

/// `model` compiled as `how` asks: the one-token step, and the prompt step where one of two
/// tokens or more is asked for; the cache updated in place unless [`cache_in_place`] says not.
pub fn compile_steps(model: &Path, how: &StepCompile) -> Result<(Bundle, Option<Bundle>), GenerateError> {
    compile_bundles(model, how, cache_in_place())
}

fn compile_bundles(
    model: &Path,
    how: &StepCompile,
    in_place: bool,
) -> Result<(Bundle, Option<Bundle>), GenerateError> {
    if how.batch == 0 || how.capacity == 0 {
        return Err(GenerateError::Input(format!(
            "a batch of {} and a cache of {} positions: both must be at least 1",
            how.batch, how.capacity
        )));
    }
    // A position past the model's table of positions (GPT-2's) would be read outside it.
    super::positions::check(model, how.capacity)?;
    let compile = |seq: usize, capacity: usize| -> Result<Bundle, GenerateError> {
        let options = CompileOptions {
            import: ImportOptions::new(prompt_inputs(model, how.batch, seq, capacity)?, vec![]),
            no_fuse: how.no_fuse,
            precision: how.precision,
            cache_in_place: in_place,
            ..Default::default()
        };
        crate::pipeline::compile(model, &options).map_err(|source| GenerateError::Compile {
            what: format!(
                "compiling {} for {seq} tokens a sequence{}",
                model.display(),
                if how.no_fuse { " (unfused)" } else { "" }
            ),
            source: Box::new(source),
        })
    };
    let step = compile(1, how.capacity)?;
    let prompt = match how.prompt.filter(|&p| p > 1) {
        Some(p) if p > how.capacity => {
            return Err(GenerateError::Input(format!(
                "a prompt step of {p} tokens does not fit a cache of {} positions",
                how.capacity
            )))
        }
        Some(p) => Some(compile(p, PROMPT_CACHE)?),
        None => None,
    };
    Ok((step, prompt))
}

impl Generator<Session> {
    /// `model` compiled as `how` asks ([`compile_steps`]) and loaded on GPU `device`, warmed
    /// up; with the one-token step's launches a run.
    pub fn compile(
        model: &Path,
        how: &StepCompile,
        device: usize,
    ) -> Result<(Generator, usize), GenerateError> {
        let (step, prompt) = compile_steps(model, how)?;
        let generator = match &prompt {
            Some(prompt) => Generator::with_prompt(&step, prompt, device)?,
            None => Generator::new(&step, device)?,
        };
        Ok((generator, step.header.launches))
    }
}

impl Generator<TractSteps> {
    /// The same generator as [`Generator::compile`]'s, its steps run by tract on the CPU: the
    /// reference a GPU's generation is checked against, and a way to generate without one.
    /// Its cache is copied each step (tract's tensors have no room for one in place).
    pub fn compile_on_cpu(model: &Path, how: &StepCompile) -> Result<Self, GenerateError> {
        let (step, prompt) = compile_bundles(model, how, false)?;
        let steps = |bundle: &Bundle| TractSteps::new(model, &bundle.header.inputs, &bundle.header.outputs);
        let layout =
            CacheLayout::of(&step.header.inputs, &step.header.outputs).map_err(GenerateError::Layout)?;
        let generator = Generator::with_steps(steps(&step)?, layout);
        match &prompt {
            Some(prompt) => {
                let layout = CacheLayout::of_prompt(&prompt.header.inputs, &prompt.header.outputs)
                    .map_err(GenerateError::Layout)?;
                generator.with_prompt_steps(steps(prompt)?, layout)
            }
            None => Ok(generator),
        }
    }
}
