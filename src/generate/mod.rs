//! Generating text with a decoder exported with its key/value cache: a [`Generator`] over a
//! session of a bundle compiled for one decoding step, its cache held on the device at a fixed
//! capacity ([`cache`]), tokens chosen from the logits ([`sampling`]).
//!
//! Each step feeds one token of every sequence of the batch: a sequence's prompt first, token
//! by token, then what it generates; every sequence has the same number of positions filled,
//! so prompts of different lengths share the steps (a shorter prompt starts generating
//! sooner). The bundle is one size, so every step replays one CUDA graph. With a prompt step
//! ([`prompt`]: the same decoder compiled for `P` tokens a sequence), the first `P` tokens of
//! every prompt run as one step, their keys and values copied into the cache.

pub mod cache;
pub mod compile;
pub mod forced;
mod on_gpu;
pub mod positions;
pub mod prompt;
pub mod reference;
pub mod sampling;
pub mod text;
pub mod timing;

use std::time::Instant;

use crate::bundle::Bundle;
use crate::ir::{DType, Element, Tensor};
use crate::runtime::{CacheCopy, RowCopy, RowDraw, RuntimeError, SampledRows, Session};
pub use cache::CacheLayout;
pub use compile::StepCompile;
pub use forced::Scored;
pub use sampling::{Sampler, Sampling};
pub use text::TextCodec;
pub use timing::PHASES;
use timing::{Clock, Marks};

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The bundle is not a decoding step with a cache.
    #[error("{0}")]
    Layout(String),
    /// The prompts or options do not fit the bundle.
    #[error("{0}")]
    Input(String),
    /// The GPU refused a step.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The decoder did not compile ([`compile::compile_steps`]).
    #[error("{what}")]
    Compile {
        /// What was being compiled (the file, the tokens a sequence).
        what: String,
        /// Why it failed.
        #[source]
        source: Box<crate::pipeline::CompileError>,
    },
}

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Tokens generated per sequence at most.
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Logits are divided by it before drawing (not used by greedy choice).
    pub temperature: f64,
    /// Seeds the draws: the same tokens for the same seed.
    pub seed: u64,
    /// A sequence ends when it generates this token (kept in its output).
    pub stop: Option<i64>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 16,
            sampling: Sampling::Greedy,
            temperature: 1.0,
            seed: 0,
            stop: None,
        }
    }
}

/// What a call to [`Generator::generate`] made.
#[derive(Clone, Debug, Default)]
pub struct Generation {
    /// The tokens generated for each prompt, in order.
    pub tokens: Vec<Vec<i64>>,
    /// Steps run (each one token of every sequence).
    pub steps: usize,
    /// From the call until every sequence had its first token, in ms.
    pub first_token_ms: f64,
    /// Each step after that one, in ms.
    pub step_ms: Vec<f64>,
    /// Those steps' time by phase, in ms ([`PHASES`]), as the host saw it.
    pub phase_ms: [f64; 5],
    /// The same phases on the GPU's clock, where asked for (`FUSEC_GENERATE_GPU_TIMES=1`) and
    /// the steps run there.
    pub gpu_phase_ms: Option<[f64; 5]>,
    /// The first [`FIRST_STEPS`] of those steps' phases one by one, as the host saw them.
    pub first_steps_ms: Vec<[f64; 5]>,
}

/// Steps after the first tokens whose phases [`Generation::first_steps_ms`] keeps apart.
pub const FIRST_STEPS: usize = 3;

impl Generation {
    /// Median ms per step after the first tokens (0 without any).
    pub fn ms_per_token(&self) -> f64 {
        let mut ms = self.step_ms.clone();
        ms.sort_by(f64::total_cmp);
        ms.get(ms.len() / 2).copied().unwrap_or(0.0)
    }

    /// Tokens generated per second over the steps after the first tokens, all sequences.
    pub fn tokens_per_second(&self, sequences: usize) -> f64 {
        let total: f64 = self.step_ms.iter().sum();
        if total > 0.0 {
            (self.step_ms.len() * sequences) as f64 / (total / 1e3)
        } else {
            0.0
        }
    }
}

/// What runs a decoding step: a [`Session`] on the GPU, or the CPU reference
/// ([`reference::TractSteps`]).
pub trait Steps {
    /// Writes input `name` (the others keep their values).
    fn write_input(&mut self, name: &str, tensor: &Tensor) -> Result<(), GenerateError>;
    /// Sets input `name` to zeros.
    fn zero_input(&mut self, name: &str) -> Result<(), GenerateError>;
    /// Sets column `column` of every row of rank-2 input `name` to `value` where these steps
    /// can without writing the input whole (on the GPU); `false`: write it whole instead.
    fn set_input_column(&mut self, name: &str, column: usize, value: f64) -> Result<bool, GenerateError> {
        let _ = (name, column, value);
        Ok(false)
    }
    /// Runs the step.
    fn execute(&mut self) -> Result<(), GenerateError>;
    /// Issues the step without waiting for it where these steps can (on the GPU, in stream
    /// order with what follows); else runs it.
    fn execute_queued(&mut self) -> Result<(), GenerateError> {
        self.execute()
    }
    /// Output `name` of the last step.
    fn read_output(&mut self, name: &str) -> Result<Tensor, GenerateError>;
    /// An f32 output of the last step into `out` (the logits, every step).
    fn read_output_f32(&mut self, name: &str, out: &mut Vec<f32>) -> Result<(), GenerateError> {
        let tensor = self.read_output(name)?;
        out.clear();
        match f32::array(&tensor) {
            Some(a) => out.extend(a.iter().copied()),
            None => out.extend(tensor.to_f64_vec().iter().map(|&v| v as f32)),
        }
        Ok(())
    }
    /// The largest value's index in each of `rows` rows of `width` of f32 output `name`,
    /// where these steps choose it themselves (on the GPU); `None`: read the output instead.
    fn argmax_rows(
        &mut self,
        name: &str,
        rows: usize,
        width: usize,
    ) -> Result<Option<Vec<i64>>, GenerateError> {
        let _ = (name, rows, width);
        Ok(None)
    }
    /// A token drawn from each of rows `at` of f32 output `name` (`draws[i]` the `i`-th row's
    /// draw), where these steps draw it themselves (on the GPU); `None`: read the output
    /// instead.
    fn sample_rows(
        &mut self,
        name: &str,
        at: SampledRows,
        draw: RowDraw,
        temperature: f64,
        draws: &[f64],
    ) -> Result<Option<Vec<i64>>, GenerateError> {
        let _ = (name, at, draw, temperature, draws);
        Ok(None)
    }
    /// The largest value's index in each of `rows` rows of `width` of f32 output `logits`,
    /// written where these steps can (on the GPU) into the `[rows, 1]` token input `tokens`
    /// for the next step without waiting, the ids read later ([`Steps::fed_tokens`]); `false`:
    /// use [`Steps::argmax_rows`] instead.
    fn argmax_feed(
        &mut self,
        logits: &str,
        rows: usize,
        width: usize,
        tokens: &str,
    ) -> Result<bool, GenerateError> {
        let _ = (logits, rows, width, tokens);
        Ok(false)
    }
    /// [`Steps::argmax_feed`] for a token drawn from each of rows `at` of `logits` (as
    /// [`Steps::sample_rows`] draws it).
    fn sample_feed(
        &mut self,
        logits: &str,
        at: SampledRows,
        draw: (RowDraw, f64),
        draws: &[f64],
        tokens: &str,
    ) -> Result<bool, GenerateError> {
        let _ = (logits, at, draw, draws, tokens);
        Ok(false)
    }
    /// The ids of the oldest [`Steps::argmax_feed`] or [`Steps::sample_feed`] not yet read.
    fn fed_tokens(&mut self) -> Result<Vec<i64>, GenerateError> {
        Err(GenerateError::Input("these steps feed no tokens back".into()))
    }
    /// Copies rows of output `from` of the last step into input `to`.
    fn copy_output_rows(&mut self, from: &str, to: &str, copy: RowCopy) -> Result<(), GenerateError>;
    /// The same copy for several (output, input) pairs.
    fn copy_output_rows_many(&mut self, pairs: &[(&str, &str)], copy: RowCopy) -> Result<(), GenerateError> {
        for (from, to) in pairs {
            self.copy_output_rows(from, to, copy)?;
        }
        Ok(())
    }
    /// [`Steps::copy_output_rows_many`], and `sets` applied in the same launch where these
    /// steps can (on the GPU): `true` where they were, else they are left to the caller.
    fn copy_output_rows_setting(&mut self, cache: CacheCopy<'_>) -> Result<bool, GenerateError> {
        self.copy_output_rows_many(cache.pairs, cache.copy)?;
        Ok(false)
    }
    /// [`Steps::argmax_feed`] (`rows` × `width` logits), then
    /// [`Steps::copy_output_rows_setting`], in one launch where these steps can (on the GPU).
    /// `None` where they feed no tokens back (nothing done), else whether the sets were applied.
    fn argmax_feed_copying(
        &mut self,
        logits: &str,
        (rows, width): (usize, usize),
        tokens: &str,
        cache: CacheCopy<'_>,
    ) -> Result<Option<bool>, GenerateError> {
        if !self.argmax_feed(logits, rows, width, tokens)? {
            return Ok(None);
        }
        self.copy_output_rows_setting(cache).map(Some)
    }
    /// [`Steps::sample_feed`], then [`Steps::copy_output_rows_setting`], in one launch where
    /// these steps can (on the GPU): as [`Steps::argmax_feed_copying`].
    fn sample_feed_copying(
        &mut self,
        logits: &str,
        (at, draw): (SampledRows, (RowDraw, f64)),
        draws: &[f64],
        tokens: &str,
        cache: CacheCopy<'_>,
    ) -> Result<Option<bool>, GenerateError> {
        if !self.sample_feed(logits, at, draw, draws, tokens)? {
            return Ok(None);
        }
        self.copy_output_rows_setting(cache).map(Some)
    }
    /// Copies rows of outputs of these steps' last run into inputs of `target` (output,
    /// input pairs): a prompt step filling the one-token step's cache.
    fn copy_output_rows_into(
        &mut self,
        target: &mut Self,
        pairs: &[(&str, &str)],
        copy: RowCopy,
    ) -> Result<(), GenerateError>;
    /// The element type of input `name`.
    fn input_type(&self, name: &str) -> Option<DType>;
    /// A timing event recorded after the work issued so far, where the steps run on a GPU.
    fn timing_event(&mut self) -> Result<Option<crate::runtime::TimingEvent>, GenerateError> {
        Ok(None)
    }
}

/// Generates tokens with a decoder's one-step bundle: on a GPU ([`Generator::new`]), or with
/// any [`Steps`].
pub struct Generator<S: Steps = Session> {
    steps: S,
    layout: CacheLayout,
    /// The prompt step and its layout, where there is one ([`prompt`]).
    prompt: Option<(S, CacheLayout)>,
}

impl Generator<Session> {
    /// Loads `bundle` (compiled with `seq` 1 and `past` at the cache's capacity) on GPU
    /// `device`, warmed up (`Session::warm_up`): the first generation's time to its first
    /// token is not the first run's one-time work.
    pub fn new(bundle: &Bundle, device: usize) -> Result<Generator, GenerateError> {
        let layout =
            CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs).map_err(GenerateError::Layout)?;
        // Its kernels launched with programmatic dependent launch: a step is ~80 small kernels,
        // each scheduled while the one before it finishes (`benches/NOTES.md`).
        let options = crate::runtime::SessionOptions { programmatic_launch: true, ..Default::default() };
        let mut session = Session::with_options(bundle, device, options)?;
        session.warm_up()?;
        // The buffers the steps' ids come back in, made now rather than in the first steps.
        session.reserve_feed(layout.batch)?;
        Ok(Generator { steps: session, layout, prompt: None })
    }
}

impl<S: Steps> Generator<S> {
    /// A generator whose steps `steps` runs, for a cache of `layout`.
    pub fn with_steps(steps: S, layout: CacheLayout) -> Self {
        Generator { steps, layout, prompt: None }
    }

    /// The cache's layout: batch, capacity, vocabulary.
    pub fn layout(&self) -> &CacheLayout {
        &self.layout
    }

    /// What runs the one-token step (the session: its outputs after a generation are those
    /// of the last step, such as the logits).
    pub fn steps_mut(&mut self) -> &mut S {
        &mut self.steps
    }

    /// Generates up to `options.max_new_tokens` tokens after each prompt (at most the batch
    /// the bundle was compiled for), calling `on_token(sequence, token)` as each is chosen.
    pub fn generate(
        &mut self,
        prompts: &[Vec<i64>],
        options: &GenerateOptions,
        mut on_token: impl FnMut(usize, i64),
    ) -> Result<Generation, GenerateError> {
        let started = Instant::now();
        let (batch, capacity, vocab) = (self.layout.batch, self.layout.capacity, self.layout.vocab);
        self.check_prompts(prompts)?;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let steps = longest + options.max_new_tokens.max(1) - 1;
        if steps > capacity + 1 {
            return Err(GenerateError::Input(format!(
                "a prompt of {longest} tokens and {} new ones need {steps} positions; the bundle's cache holds {} \
                 (compile with a larger --dim past)",
                options.max_new_tokens,
                capacity + 1
            )));
        }
        let mut sampler = Sampler::new(options.sampling, options.temperature, options.seed)
            .map_err(GenerateError::Input)?;
        for pair in &self.layout.pairs {
            self.steps.zero_input(&pair.past)?;
        }
        // Rows past the prompts given run the first prompt; their tokens are not kept.
        let rows: Vec<&Vec<i64>> = (0..batch).map(|b| prompts.get(b).unwrap_or(&prompts[0])).collect();
        let mut out = Generation { tokens: vec![Vec::new(); prompts.len()], ..Default::default() };
        let mut done = vec![options.max_new_tokens == 0; prompts.len()];
        let mut logits = Vec::with_capacity(batch * vocab);
        let start =
            self.run_prompt(&rows, prompts, options, &mut sampler, &mut out, &mut done, &mut on_token)?;
        if start > 0 && start == longest {
            out.first_token_ms = started.elapsed().as_secs_f64() * 1e3;
        }
        let mut last_step = Instant::now();
        // Once every sequence is past its prompt, each step's ids (greedy or drawn) are chosen
        // on the device and written into the next step's token input there (where the steps
        // can): the next step is queued before this one's ids are read, one step late (`fed`:
        // that step and which sequences take a token there; from then on the token input is
        // the device's).
        let mut fed: Option<(usize, Vec<bool>)> = None;
        let mut marks = timing::gpu_times().then(Marks::default);
        // The step whose position and mask column the last cache copy set, if any.
        let mut advanced: Option<usize> = None;
        for t in start..steps {
            if done.iter().all(|&d| d) {
                break;
            }
            let phases_before = out.phase_ms;
            let mut clock = Clock::new(t + 1 > longest, &mut out.phase_ms, marks.as_mut());
            if fed.is_none() {
                let tokens: Vec<f64> = (0..batch)
                    .map(|b| match (rows[b].get(t), out.tokens.get(b).and_then(|g| g.last())) {
                        (Some(&p), _) => p as f64,
                        (None, Some(&g)) => g as f64,
                        (None, None) => rows[b][rows[b].len() - 1] as f64,
                    })
                    .collect();
                self.write(cache::TOKENS, &[batch, 1], tokens)?;
            }
            // Where the last step's cache copy also set this step's position and mask column
            // (`copy_cache`), they are not written again.
            let preset = advanced == Some(t);
            if !preset && !self.steps.set_input_column(cache::POSITIONS, 0, t as f64)? {
                self.write(cache::POSITIONS, &[batch, 1], vec![t as f64; batch])?;
            }
            // The mask takes the positions cached (before t) and the step's own (the last
            // column): written whole at the first step, then one column a step, where the
            // steps can set one on the device.
            if !preset && (t == start || !self.steps.set_input_column(cache::MASK, t - 1, 1.0)?) {
                self.write(cache::MASK, &[batch, capacity + 1], step_mask(batch, capacity, t))?;
            }
            clock.lap(0, &mut self.steps)?;
            // Not waited for: what reads its results next waits (or, feeding ids back, only
            // the previous step's copy of them).
            self.steps.execute_queued()?;
            clock.lap(1, &mut self.steps)?;
            // The sequences that take a token now, and a draw for each (in order) where the
            // sampler draws: made for a sequence done since as well, so that what is drawn does
            // not depend on when the host learns a sequence is done (one step late where ids
            // are fed back).
            let takes: Vec<bool> =
                (0..batch).map(|b| b < prompts.len() && t + 1 >= prompts[b].len()).collect();
            let draws = draws_for(&mut sampler, &takes);
            let at = SampledRows { rows: batch, width: vocab, step: 1, offset: 0 };
            // With one copy for the cache: the choice (or draw) and the copy in one launch.
            let mut copied = None;
            let logits_name = &self.layout.logits;
            let fed_now = t + 1 >= longest
                && match (sampler.row_draw(), self.layout.one_copy(t, t + 1 < steps)) {
                    (None, Some(one)) => {
                        copied = self.steps.argmax_feed_copying(
                            logits_name,
                            (batch, vocab),
                            cache::TOKENS,
                            one.as_copy(),
                        )?;
                        copied.is_some()
                    }
                    (None, None) => self.steps.argmax_feed(logits_name, batch, vocab, cache::TOKENS)?,
                    (Some(draw), Some(one)) => {
                        copied = self.steps.sample_feed_copying(
                            logits_name,
                            (at, draw),
                            &draws,
                            cache::TOKENS,
                            one.as_copy(),
                        )?;
                        copied.is_some()
                    }
                    (Some(draw), None) => {
                        self.steps.sample_feed(logits_name, at, draw, &draws, cache::TOKENS)?
                    }
                };
            if fed_now {
                clock.lap(2, &mut self.steps)?;
                let set = match copied {
                    Some(set) => set,
                    None => self.copy_cache(t, t + 1 < steps)?,
                };
                advanced = set.then_some(t + 1);
                clock.lap(4, &mut self.steps)?;
                // The previous step's ids, read while this one runs.
                let first = (longest, started);
                if let Some(ms) = read_fed(
                    &mut self.steps,
                    fed.take(),
                    first,
                    &mut out.tokens,
                    &mut done,
                    options,
                    &mut on_token,
                )? {
                    out.first_token_ms = ms;
                }
                clock.lap(3, &mut self.steps)?;
                fed = Some((t, takes));
            } else {
                let chosen =
                    logits_of(&mut self.steps, &self.layout.logits, at, &sampler, &draws, &mut logits)?;
                clock.lap(2, &mut self.steps)?;
                for b in 0..prompts.len() {
                    if takes[b] && !done[b] {
                        let token = pick(&chosen, &logits, &sampler, at, b, &draws);
                        record(&mut out.tokens, &mut done, b, token, options, &mut on_token);
                    }
                }
                clock.lap(3, &mut self.steps)?;
                advanced = self.copy_cache(t, t + 1 < steps)?.then_some(t + 1);
                clock.lap(4, &mut self.steps)?;
            }
            out.steps += 1;
            let now = Instant::now();
            if t + 1 == longest && fed.is_none() {
                out.first_token_ms = (now - started).as_secs_f64() * 1e3;
            } else if t + 1 > longest {
                out.step_ms.push((now - last_step).as_secs_f64() * 1e3);
                if out.first_steps_ms.len() < FIRST_STEPS {
                    out.first_steps_ms.push(std::array::from_fn(|i| out.phase_ms[i] - phases_before[i]));
                }
            }
            last_step = now;
        }
        if let Some(ms) = read_fed(
            &mut self.steps,
            fed,
            (longest, started),
            &mut out.tokens,
            &mut done,
            options,
            &mut on_token,
        )? {
            out.first_token_ms = ms;
        }
        if let Some(marks) = marks.filter(|m| !m.is_empty()) {
            out.gpu_phase_ms = Some(marks.phase_ms()?);
        }
        Ok(out)
    }

    /// After step `t`: the new token's keys and values copied into the cache's slot `t`
    /// (nothing once the cache is full) and, where a step follows (`next`) and the steps can,
    /// its position (`t + 1`) and mask column (`t`) set in the same launch: `true` where they
    /// were.
    fn copy_cache(&mut self, t: usize, next: bool) -> Result<bool, GenerateError> {
        if t >= self.layout.capacity {
            return Ok(false);
        }
        if let Some(one) = self.layout.one_copy(t, next) {
            return self.steps.copy_output_rows_setting(one.as_copy());
        }
        for pair in &self.layout.pairs {
            self.steps.copy_output_rows(&pair.present, &pair.past, self.layout.append(pair, t))?;
        }
        Ok(false)
    }

    fn write(&mut self, name: &str, shape: &[usize], values: Vec<f64>) -> Result<(), GenerateError> {
        write_input(&mut self.steps, name, shape, values)
    }

    /// Refuses prompts the step cannot take: none, more than its batch, an empty one, or a
    /// token outside the vocabulary.
    fn check_prompts(&self, prompts: &[Vec<i64>]) -> Result<(), GenerateError> {
        let batch = self.layout.batch;
        if prompts.is_empty() || prompts.len() > batch || prompts.iter().any(Vec::is_empty) {
            return Err(GenerateError::Input(format!(
                "{} prompts given: give 1 to {batch} (the batch the bundle was compiled for), none empty",
                prompts.len()
            )));
        }
        self.check_vocabulary(prompts)
    }

    /// Refuses a token outside the vocabulary.
    fn check_vocabulary(&self, tokens: &[Vec<i64>]) -> Result<(), GenerateError> {
        let vocab = self.layout.vocab;
        match tokens.iter().flatten().find(|&&t| t < 0 || t as usize >= vocab) {
            Some(t) => Err(GenerateError::Input(format!("token {t} is outside the vocabulary of {vocab}"))),
            None => Ok(()),
        }
    }
}

/// A one-token step's mask at step `t` for `batch` rows over a cache of `capacity` positions:
/// the positions cached (before `t`) and the step's own (the last column).
fn step_mask(batch: usize, capacity: usize, t: usize) -> Vec<f64> {
    (0..batch)
        .flat_map(|_| (0..=capacity).map(move |j| f64::from(u8::from(j < t || j == capacity))))
        .collect()
}

/// One draw each for the rows that take a token (`picks`), in order, where the sampler draws;
/// 0 for the others.
fn draws_for(sampler: &mut Sampler, picks: &[bool]) -> Vec<f64> {
    picks.iter().map(|&p| if p && sampler.row_draw().is_some() { sampler.draw() } else { 0.0 }).collect()
}

/// The choices for rows `at` of the logits (output `name` of the last step), made where the
/// steps make them (on the GPU: greedy or drawn with `draws`, only the ids come back), else
/// `None` with the logits read into `logits` for the host to choose from ([`pick`]).
fn logits_of<S: Steps>(
    steps: &mut S,
    name: &str,
    at: SampledRows,
    sampler: &Sampler,
    draws: &[f64],
    logits: &mut Vec<f32>,
) -> Result<Option<Vec<i64>>, GenerateError> {
    let chosen = match sampler.row_draw() {
        None => {
            let rows = (at.rows - 1) * at.step + at.offset + 1;
            let ids = steps.argmax_rows(name, rows, at.width)?;
            ids.map(|ids| (0..at.rows).map(|i| ids[i * at.step + at.offset]).collect())
        }
        Some((draw, temperature)) => steps.sample_rows(name, at, draw, temperature, draws)?,
    };
    if chosen.is_none() {
        steps.read_output_f32(name, logits)?;
    }
    Ok(chosen)
}

/// The token of the `i`-th row of `at`: the steps' choice, or the sampler's from the logits
/// read with that row's draw.
fn pick(
    chosen: &Option<Vec<i64>>,
    logits: &[f32],
    sampler: &Sampler,
    at: SampledRows,
    i: usize,
    draws: &[f64],
) -> i64 {
    match chosen {
        Some(ids) => ids[i],
        None => {
            let row = i * at.step + at.offset;
            sampler.choose_with(&logits[row * at.width..(row + 1) * at.width], draws[i]) as i64
        }
    }
}

/// Reads the ids fed back for the step `fed` holds, if any (`takes`: the sequences that take
/// a token there), and records them for the sequences not yet done; where that step ends the
/// longest prompt (`first`: its length, and when the generation started), the time to the
/// first tokens, in ms.
fn read_fed<S: Steps>(
    steps: &mut S,
    fed: Option<(usize, Vec<bool>)>,
    first: (usize, Instant),
    tokens: &mut [Vec<i64>],
    done: &mut [bool],
    options: &GenerateOptions,
    on_token: &mut impl FnMut(usize, i64),
) -> Result<Option<f64>, GenerateError> {
    let Some((at, takes)) = fed else { return Ok(None) };
    let ids = steps.fed_tokens()?;
    for b in 0..done.len() {
        if takes[b] && !done[b] {
            record(tokens, done, b, ids[b], options, on_token);
        }
    }
    Ok((at + 1 == first.0).then(|| first.1.elapsed().as_secs_f64() * 1e3))
}

/// Records `token` as sequence `b`'s next: streamed to `on_token`, the sequence done at
/// `options.max_new_tokens` or its stop token.
fn record(
    tokens: &mut [Vec<i64>],
    done: &mut [bool],
    b: usize,
    token: i64,
    options: &GenerateOptions,
    on_token: &mut impl FnMut(usize, i64),
) {
    tokens[b].push(token);
    on_token(b, token);
    done[b] = tokens[b].len() >= options.max_new_tokens || options.stop == Some(token);
}

/// Writes input `name` of `steps` from `values` of `shape`, in the input's element type.
fn write_input<S: Steps>(
    steps: &mut S,
    name: &str,
    shape: &[usize],
    values: Vec<f64>,
) -> Result<(), GenerateError> {
    let dtype = steps.input_type(name).unwrap_or(DType::I64);
    let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values)
        .map_err(|e| GenerateError::Input(format!("input '{name}': {e}")))?;
    steps.write_input(name, &Tensor::from_f64(array, dtype))
}
