//! `fusec bench --decode PROMPTxNEW`: a decoder with a cache generating tokens, fused against
//! unfused: each compiled for one step at the batch and cache the setting needs, each run
//! greedy from the same prompts after a warm-up generation, the prompts in one prompt step;
//! time to the first tokens and ms per token after them (the median step), side by side.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use fusec::generate::{GenerateOptions, Generator, StepCompile};
use fusec::ir::DType;

/// What one build measured.
struct Measured {
    first_token_ms: f64,
    ms_per_token: f64,
    tokens: Vec<Vec<i64>>,
    launches: usize,
}

/// `PROMPTxNEW` (`128x256`) as prompt tokens and new tokens.
pub fn parse_setting(text: &str) -> anyhow::Result<(usize, usize)> {
    let parsed =
        text.split_once('x').and_then(|(p, n)| Some((p.trim().parse().ok()?, n.trim().parse().ok()?)));
    match parsed {
        Some((prompt, new)) if prompt > 0 && new > 0 => Ok((prompt, new)),
        _ => bail!("--decode {text}: not PROMPTxNEW, e.g. 128x256 (prompt tokens x new tokens, both over 0)"),
    }
}

/// Prompt ids of `len` tokens below `vocab` for `batch` sequences, the same every run.
fn prompts(batch: usize, len: usize, vocab: usize) -> Vec<Vec<i64>> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    (0..batch)
        .map(|_| {
            (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % vocab.max(1) as u64) as i64
                })
                .collect()
        })
        .collect()
}

fn measure(
    model: &Path,
    batch: usize,
    (prompt, new): (usize, usize),
    precision: DType,
    no_fuse: bool,
    device: usize,
) -> anyhow::Result<Measured> {
    let how = StepCompile { batch, capacity: prompt + new, precision, no_fuse, prompt: Some(prompt) };
    let (mut generator, launches) = Generator::compile(model, &how, device)?;
    let prompts = prompts(batch, prompt, generator.layout().vocab);
    let options = GenerateOptions { max_new_tokens: new, ..Default::default() };
    // A warm-up generation: kernels loaded, CUDA graph captured, GEMM algorithms chosen.
    generator.generate(
        &prompts,
        &GenerateOptions { max_new_tokens: new.min(16), ..Default::default() },
        |_, _| {},
    )?;
    let generation = generator.generate(&prompts, &options, |_, _| {})?;
    Ok(Measured {
        first_token_ms: generation.first_token_ms,
        ms_per_token: generation.ms_per_token(),
        tokens: generation.tokens,
        launches,
    })
}

/// Runs the comparison; with `strict`, exit status 1 when the fused build decodes slower.
pub fn bench_decode(
    model: &Path,
    batch: usize,
    setting: (usize, usize),
    precision: DType,
    device: usize,
    strict: bool,
) -> anyhow::Result<ExitCode> {
    let fused = measure(model, batch, setting, precision, false, device)?;
    let unfused = measure(model, batch, setting, precision, true, device)?;
    println!(
        "{}: batch {batch}, {}-token prompts, {} new tokens, {precision}, greedy",
        model.display(),
        setting.0,
        setting.1
    );
    println!(
        "{:<8} {:>9} {:>20} {:>13} {:>10}",
        "build", "launches", "first tokens (ms)", "ms per token", "tokens/s"
    );
    for (name, m) in [("unfused", &unfused), ("fused", &fused)] {
        println!(
            "{name:<8} {:>9} {:>20.2} {:>13.3} {:>10.0}",
            m.launches,
            m.first_token_ms,
            m.ms_per_token,
            batch as f64 * 1e3 / m.ms_per_token
        );
    }
    println!(
        "speed-up: {:.2}x per token, {:.2}x to the first tokens",
        unfused.ms_per_token / fused.ms_per_token,
        unfused.first_token_ms / fused.first_token_ms
    );
    let same = fused.tokens.iter().zip(&unfused.tokens).filter(|(a, b)| a == b).count();
    println!("sequences with the same greedy tokens in both builds: {same} of {batch}");
    if fused.ms_per_token > unfused.ms_per_token {
        eprintln!("warning: the fused build decodes slower than the unfused one");
        if strict {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_ones_are_named() {
        assert_eq!(parse_setting("128x256").unwrap(), (128, 256));
        for bad in ["128", "0x4", "ax2", "4x0", "4x"] {
            let err = parse_setting(bad).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains("PROMPTxNEW"), "{err}");
        }
    }

    #[test]
    fn prompts_are_deterministic_and_in_the_vocabulary() {
        let a = prompts(3, 17, 512);
        assert_eq!(a, prompts(3, 17, 512));
        assert!(a.iter().flatten().all(|&t| (0..512).contains(&t)));
        assert_ne!(a[0], a[1]);
    }
}
