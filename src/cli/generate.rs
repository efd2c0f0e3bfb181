//! `fusec generate`: decode tokens with a decoder exported with its key/value cache.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use fusec::generate::{GenerateOptions, Generation, Generator, Sampling, StepCompile};
use fusec::ir::DType;
use fusec::Bundle;

/// Generate tokens with a decoder exported with its key/value cache (inputs `input_ids`,
/// `attention_mask`, `position_ids`, `past_key_values.{i}.key|value`; outputs `logits`,
/// `present.{i}.key|value`).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    fusec generate models/gpt2_cache_ts.onnx --prompt-ids 1,2,3 --max-new-tokens 16\n  \
    fusec generate models/llama_cache_ts.onnx --prompt-ids 5,6 --prompt-ids 7,8,9 --sample top-k=20 --seed 3\n  \
    fusec generate models/gpt2_cache_ts.onnx --tokenizer models/tokenizer_words.json --prompt \"the cat sat\"\n  \
    fusec compile models/gpt2_cache_ts.onnx -o step.bundle --dim batch=1 --dim seq=1 --dim past=63 --dim total=past+seq\n  \
    fusec generate step.bundle --prompt-ids 1,2,3\n  \
    fusec generate models/gpt2_cache_ts.onnx --prompt-ids 1,2,3 --max-new-tokens 8 --check\n  \
    fusec generate models/gpt2_cache_ts.onnx --prompt-ids 1,2,3 --max-new-tokens 8 --cpu")]
pub struct Generate {
    /// The decoder: an ONNX model (compiled here for one decoding step), or a bundle compiled
    /// with `--dim seq=1` and `past` set to the cache's capacity.
    model: PathBuf,
    /// A prompt's token ids, comma-separated; repeat for a batch of prompts.
    #[arg(long = "prompt-ids", value_name = "IDS", required_unless_present = "text")]
    prompts: Vec<String>,
    /// A prompt as text, encoded with --tokenizer; repeat for a batch of prompts.
    #[arg(long = "prompt", value_name = "TEXT", id = "text", requires = "tokenizer")]
    texts: Vec<String>,
    /// A Hugging Face tokenizer file (tokenizer.json): encodes --prompt, and the generated
    /// tokens are printed as text too.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Tokens to generate after each prompt, at most.
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    /// Sequences a step runs (an ONNX model): at least the prompts given. Default: that many.
    #[arg(long)]
    batch: Option<usize>,
    /// Positions the cache holds (an ONNX model): prompt and generated tokens together, less
    /// one. Default: the longest prompt plus --max-new-tokens.
    #[arg(long)]
    capacity: Option<usize>,
    /// How each token is chosen: greedy, top-k=K or top-p=P.
    #[arg(long, default_value = "greedy", value_parser = parse_sampling)]
    sample: Sampling,
    /// Logits are divided by it before a draw (top-k, top-p).
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Seeds the draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A sequence ends at this token.
    #[arg(long)]
    stop: Option<i64>,
    /// Element type of weights and activations (an ONNX model).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16", "bf16"])]
    precision: String,
    /// The GPU to run on.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Run prompts token by token (an ONNX model): no prompt step. By default the first
    /// tokens of every prompt (as many as the shortest has) run as one step of a second
    /// compile of the model.
    #[arg(long)]
    token_by_token: bool,
    /// Run the steps with tract on the CPU instead of a GPU (the ONNX model, or the one a
    /// bundle was compiled from, in f32 as exported): the same loop and tokens, slowly, on a
    /// machine without one.
    #[arg(long, conflicts_with = "check")]
    cpu: bool,
    /// Generate on the GPU, then feed each prompt and the GPU's tokens to tract on the CPU
    /// (f32) one step at a time and score each token against the CPU's logits at the same
    /// prefix: in an fp32 build each must be the CPU's best, in fp16 within 1e-2 × the logits'
    /// root mean square of it (a near tie), in bf16 within 8e-2.
    #[arg(long)]
    check: bool,
}

fn parse_sampling(text: &str) -> Result<Sampling, String> {
    text.parse()
}

fn parse_prompt(text: &str) -> anyhow::Result<Vec<i64>> {
    text.split(',')
        .map(|t| {
            t.trim().parse::<i64>().with_context(|| format!("--prompt-ids '{text}': '{t}' is not a token id"))
        })
        .collect()
}

impl Generate {
    /// Runs it; `verbose` (`-v`) also prints the one-token step's GEMM choices on standard error.
    pub fn execute(self, verbose: bool) -> anyhow::Result<ExitCode> {
        let codec = self.tokenizer.as_deref().map(fusec::generate::TextCodec::load).transpose()?;
        let mut prompts: Vec<Vec<i64>> =
            self.prompts.iter().map(|p| parse_prompt(p)).collect::<anyhow::Result<_>>()?;
        if let Some(codec) = &codec {
            for text in &self.texts {
                let ids = codec.encode(text)?;
                if ids.is_empty() {
                    bail!("--prompt {text:?} encodes to no tokens");
                }
                prompts.push(ids);
            }
        }
        let is_onnx = self.model.extension().is_some_and(|e| e == "onnx");
        self.check_reference_flags()?;
        // A bundle's steps: on the GPU as compiled; on the CPU, its own ONNX file's.
        let bundle = if is_onnx { None } else { Some(Bundle::load(&self.model)?) };
        let options = GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            sampling: self.sample,
            temperature: self.temperature,
            seed: self.seed,
            stop: self.stop,
        };
        if self.cpu {
            let (generation, prompt_length) = self.generate_on_cpu(&prompts, &options, bundle.as_ref())?;
            self.report(&generation, &prompts, codec.as_ref(), prompt_length, "on the CPU")?;
            return Ok(ExitCode::SUCCESS);
        }
        let mut generator = if let Some(bundle) = &bundle {
            Generator::new(bundle, self.device)?
        } else {
            let how = self.step_compile(&prompts, super::shapes::precision(&self.precision));
            eprintln!(
                "compiling {} for one step: batch {}, cache of {} positions{}",
                self.model.display(),
                how.batch,
                how.capacity,
                match how.prompt {
                    Some(p) if p > 1 => format!(", and for a prompt step of {p} tokens"),
                    _ => String::new(),
                }
            );
            Generator::compile(&self.model, &how, self.device)?.0
        };
        let generation = generator.generate(&prompts, &options, |_, _| {})?;
        if verbose {
            super::bench_report::gemm_choice_lines(&generator.steps_mut().gemm_choices)
                .iter()
                .for_each(|l| eprintln!("one-token step: {l}"));
            eprintln!("{}", step_spread(&generation.step_ms));
            for (i, phases) in generation.first_steps_ms.iter().enumerate() {
                let each: Vec<String> = fusec::generate::PHASES
                    .iter()
                    .zip(phases)
                    .map(|(name, ms)| format!("{name} {ms:.3}"))
                    .collect();
                eprintln!("step {} after the first tokens, ms: {}", i + 1, each.join(", "));
            }
        }
        self.report(&generation, &prompts, codec.as_ref(), generator.prompt_length(), "")?;
        if let Some(gpu) = generation.gpu_phase_ms {
            let steps = generation.step_ms.len().max(1) as f64;
            let phases: Vec<String> = fusec::generate::PHASES
                .iter()
                .zip(gpu)
                .map(|(name, ms)| format!("{name} {:.4}", ms / steps))
                .collect();
            println!("GPU ms per step after the first tokens: {}", phases.join(", "));
        }
        if self.check {
            drop(generator);
            return self.check_on_cpu(&prompts, bundle.as_ref(), &generation.tokens);
        }
        Ok(ExitCode::SUCCESS)
    }

    /// `--check` compares greedy tokens; `--cpu` runs the ONNX file's own f32.
    fn check_reference_flags(&self) -> anyhow::Result<()> {
        if self.check && self.sample != Sampling::Greedy {
            bail!("--check compares greedy tokens: leave out --sample {}", self.sample);
        }
        if self.cpu && self.precision != "fp32" {
            bail!("--cpu runs the model as exported, in f32: leave out --precision {}", self.precision);
        }
        Ok(())
    }

    /// The ONNX file tract runs and what its steps are compiled for: the model given, or a
    /// bundle's own file (the one it was compiled from) at the bundle's batch and capacity,
    /// without a prompt step (a bundle has none).
    fn reference(
        &self,
        prompts: &[Vec<i64>],
        bundle: Option<&Bundle>,
    ) -> anyhow::Result<(PathBuf, StepCompile)> {
        let Some(bundle) = bundle else {
            return Ok((self.model.clone(), self.step_compile(prompts, DType::F32)));
        };
        let layout = fusec::generate::CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs)
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.model.display()))?;
        let model = PathBuf::from(&bundle.header.model);
        if !model.is_file() {
            bail!(
                "{} was compiled from {}, which is not there: tract runs that ONNX file on the CPU",
                self.model.display(),
                model.display()
            );
        }
        let how = StepCompile {
            batch: layout.batch,
            capacity: layout.capacity,
            precision: DType::F32,
            no_fuse: false,
            prompt: None,
        };
        Ok((model, how))
    }

    /// The generation with tract on the CPU ([`Self::reference`]'s file and steps), and its
    /// prompt step's length.
    fn generate_on_cpu(
        &self,
        prompts: &[Vec<i64>],
        options: &GenerateOptions,
        bundle: Option<&Bundle>,
    ) -> anyhow::Result<(Generation, Option<usize>)> {
        let mut generator = self.cpu_generator(prompts, bundle)?;
        let generation = generator.generate(prompts, options, |_, _| {})?;
        Ok((generation, generator.prompt_length()))
    }

    /// The steps of [`Self::reference`]'s file, run by tract on the CPU.
    fn cpu_generator(
        &self,
        prompts: &[Vec<i64>],
        bundle: Option<&Bundle>,
    ) -> anyhow::Result<Generator<fusec::generate::reference::TractSteps>> {
        let (model, how) = self.reference(prompts, bundle)?;
        eprintln!(
            "compiling {} for one step (its inputs and outputs), the steps run by tract on the CPU (f32): batch {}, cache of {} positions",
            model.display(),
            how.batch,
            how.capacity
        );
        Ok(Generator::compile_on_cpu(&model, &how)?)
    }

    /// What an ONNX model is compiled for: the batch and the cache's capacity (the options', else
    /// from the prompts) and the prompt step's length.
    fn step_compile(&self, prompts: &[Vec<i64>], precision: DType) -> StepCompile {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
        StepCompile {
            batch: self.batch.unwrap_or(prompts.len()),
            capacity: self.capacity.unwrap_or(longest + self.max_new_tokens),
            precision,
            no_fuse: false,
            prompt: (!self.token_by_token).then_some(shortest),
        }
    }

    /// Prints each sequence's tokens (and text), then the times: to the first token, a token
    /// after it, tokens/s and each phase's share of a step. `where_` names where it ran.
    fn report(
        &self,
        generation: &Generation,
        prompts: &[Vec<i64>],
        codec: Option<&fusec::generate::TextCodec>,
        prompt_length: Option<usize>,
        where_: &str,
    ) -> anyhow::Result<()> {
        for (b, tokens) in generation.tokens.iter().enumerate() {
            let ids: Vec<String> = tokens.iter().map(i64::to_string).collect();
            println!("sequence {b}: {}", ids.join(","));
            if let Some(codec) = codec {
                println!("sequence {b} text: {:?} + {:?}", codec.decode(&prompts[b])?, codec.decode(tokens)?);
            }
        }
        if generation.tokens.iter().all(Vec::is_empty) && self.max_new_tokens > 0 {
            bail!("no tokens were generated");
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
        let prompt_steps = match prompt_length {
            Some(p) if p > 1 && p <= shortest => {
                format!("a prompt step of {p} tokens, then {} token steps", longest - p)
            }
            _ => format!("{longest} prompt steps"),
        };
        println!(
            "time to first token {:.2} ms ({prompt_steps}), {:.3} ms per token after it, {:.0} tokens/s ({}, {}){}",
            generation.first_token_ms,
            generation.ms_per_token(),
            generation.tokens_per_second(prompts.len()),
            sequences(prompts.len()),
            self.sample,
            if where_.is_empty() { String::new() } else { format!(" {where_}") }
        );
        let steps = generation.step_ms.len().max(1) as f64;
        let phases: Vec<String> = fusec::generate::PHASES
            .iter()
            .zip(generation.phase_ms)
            .map(|(name, ms)| format!("{name} {:.3}", ms / steps))
            .collect();
        println!("ms per step after the first tokens: {}", phases.join(", "));
        Ok(())
    }

    /// `--check`: each sequence's prompt and the GPU's tokens fed to tract on the CPU (f32), one
    /// token a step, and each token scored against the CPU's logits at the same prefix
    /// ([`fusec::generate::Scored`]). In an fp32 build every token must be the CPU's best; in
    /// fp16/bf16 within [`near_tie`] × the logits' root mean square of it (two logits within a
    /// rounding of each other may be chosen either way), and how many are the best is printed.
    fn check_on_cpu(
        &self,
        prompts: &[Vec<i64>],
        bundle: Option<&Bundle>,
        gpu: &[Vec<i64>],
    ) -> anyhow::Result<ExitCode> {
        let scores = self.cpu_generator(prompts, bundle)?.score(prompts, gpu)?;
        let precision = match bundle {
            Some(bundle) => bundle.header.precision,
            None => super::shapes::precision(&self.precision),
        };
        let allowed = near_tie(precision);
        let mut failed = 0;
        for (b, scored) in scores.iter().enumerate() {
            let best = scored.iter().filter(|s| s.is_best()).count();
            let worst = scored.iter().enumerate().max_by(|x, y| x.1.gap().total_cmp(&y.1.gap()));
            let pass = scored.iter().all(|s| s.gap() <= allowed);
            let detail = match worst {
                None => "no tokens to check".to_string(),
                Some(_) if best == scored.len() => format!("all {best} tokens as on the CPU"),
                Some((i, s)) => format!(
                    "{best} of {} tokens the CPU's best at the same prefix; the farthest, token {i} ({}), {:.2e} × the logits' rms below the CPU's best ({})",
                    scored.len(),
                    s.token,
                    s.gap(),
                    s.best.0
                ),
            };
            println!("check sequence {b}: {detail}: {}", if pass { "pass" } else { "FAIL" });
            failed += usize::from(!pass);
        }
        if failed > 0 {
            let why = if allowed == 0.0 {
                "an fp32 build chooses every greedy token as tract's logits do".to_string()
            } else {
                format!("a {precision:?} build chooses each token within {allowed:e} × the logits' rms of tract's best")
            };
            bail!("{failed} sequence(s) differ from the CPU reference ({why})");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// How far below the CPU's best logit (in units of the row's root mean square) a build's greedy
/// token may lie in `generate --check`: none in f32; in fp16 #27's bound on an fp16 step's
/// logits (rel-L2 1e-2), taken for one logit; in bf16 eight times that, as bf16 keeps three
/// fewer mantissa bits than fp16 (its rounding 2^-8 against 2^-11).
fn near_tie(precision: DType) -> f32 {
    match precision {
        DType::F16 => 1e-2,
        DType::BF16 => 8e-2,
        _ => 0.0,
    }
}

/// `n` sequences, in words ("1 sequence", "8 sequences").
fn sequences(n: usize) -> String {
    format!("{n} sequence{}", if n == 1 { "" } else { "s" })
}

/// The one-token steps' times as a line: their count, mean, the 10th, 50th and 90th percentiles,
/// the slowest, and the first and last few, ms (what separates the mean `tokens/s` counts from
/// the median `ms per token` reports).
fn step_spread(step_ms: &[f64]) -> String {
    if step_ms.is_empty() {
        return "steps after the first tokens: none".to_string();
    }
    let mut sorted = step_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let mean = step_ms.iter().sum::<f64>() / step_ms.len() as f64;
    let few = |s: &[f64]| s.iter().map(|v| format!("{v:.3}")).collect::<Vec<_>>().join(" ");
    let n = step_ms.len();
    format!(
        "steps after the first tokens: {n}, mean {mean:.4} ms, p10 {:.4}, median {:.4}, p90 {:.4}, slowest {:.4}; first {}; last {}",
        at(0.1),
        sorted[n / 2],
        at(0.9),
        at(1.0),
        few(&step_ms[..n.min(4)]),
        few(&step_ms[n.saturating_sub(4)..])
    )
}

#[cfg(test)]
mod tests {
    use super::step_spread;

    #[test]
    fn step_spread_reports_the_slow_first_step_the_mean_carries() {
        // Eleven steps: a slow first one, then 0.40 to 0.49 ms.
        let mut steps = vec![1.5];
        steps.extend((0..10).map(|i| 0.40 + 0.01 * f64::from(i)));
        let line = step_spread(&steps);
        let mean = steps.iter().sum::<f64>() / 11.0;
        assert!(line.starts_with("steps after the first tokens: 11, "), "{line}");
        assert!(line.contains(&format!("mean {mean:.4} ms")), "{line}");
        // Sorted: 0.40 … 0.49, 1.5; the median is the sixth (0.45), p10 the second (0.41).
        assert!(line.contains("p10 0.4100, median 0.4500, p90 0.4900, slowest 1.5000"), "{line}");
        assert!(line.contains("first 1.500 0.400 0.410 0.420; last 0.460 0.470 0.480 0.490"), "{line}");
        assert_eq!(step_spread(&[]), "steps after the first tokens: none");
    }
}
