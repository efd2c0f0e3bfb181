//! A batch decoded as parts run side by side: `P` generators of `B / P` sequences each, each
//! its own session (stream and CUDA graph), their `generate` calls on `P` threads at once,
//! against one generator of `B` sequences in the same process. A decoding step at tens of rows
//! is a chain of latency-bound kernels; two independent chains on one GPU may overlap where
//! one chain alone leaves it idle, at the cost of reading the weights once a part.
//!
//!     cargo run --release --example halves -- MODEL.onnx [BATCH] [PARTS] [PROMPT] [NEW] [PRECISION]
//!
//! Prints each run's ms a token (median of its steps) and tokens/s (all its sequences), and
//! for the parts their tokens/s summed and over the wall time of the calls together.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Barrier, Mutex};
use std::time::Instant;

use fusec::generate::{GenerateOptions, Generation, Generator, StepCompile};
use fusec::ir::DType;

/// Rounds of the comparison.
const ROUNDS: usize = 3;

fn prompts(batch: usize, length: usize, first: usize) -> Vec<Vec<i64>> {
    (0..batch)
        .map(|b| (0..length).map(|j| (((first + b) * 7919 + j * 104_729) % 30_000 + 1) as i64).collect())
        .collect()
}

fn generator(model: &Path, batch: usize, prompt: usize, new: usize, precision: &str) -> Generator {
    let precision = match precision {
        "fp16" => DType::F16,
        "bf16" => DType::BF16,
        _ => DType::F32,
    };
    let how = StepCompile { batch, capacity: prompt + new, precision, no_fuse: false, prompt: Some(prompt) };
    Generator::compile(model, &how, 0).expect("the generator").0
}

fn line(what: &str, g: &Generation, sequences: usize) {
    println!(
        "{what}: {:.4} ms a token, {:.0} tokens/s ({sequences} sequences, {} steps), first token {:.2} ms",
        g.ms_per_token(),
        g.tokens_per_second(sequences),
        g.step_ms.len(),
        g.first_token_ms
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = PathBuf::from(args.get(1).expect("MODEL.onnx"));
    let arg = |i: usize, default: usize| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let (batch, parts, prompt, new) = (arg(2, 32), arg(3, 2), arg(4, 128), arg(5, 256));
    let precision = args.get(6).map_or("fp16", String::as_str);
    assert!(parts >= 1 && batch % parts == 0, "BATCH must be a multiple of PARTS");
    let part = batch / parts;
    let options = GenerateOptions { max_new_tokens: new, ..Default::default() };

    // A session stays on the thread that made it: each part's generator is made (one at a
    // time, so that their GEMM timings at load do not overlap) and run on its own thread.
    let mut whole = generator(&model, batch, prompt, new, precision);
    let mut alone = generator(&model, part, prompt, new, precision);
    let (go, done) = (Barrier::new(parts + 1), Barrier::new(parts + 1));
    let loading = Mutex::new(());
    let (sender, results) = mpsc::channel::<(usize, Generation)>();
    std::thread::scope(|s| {
        for i in 0..parts {
            let (go, done, loading, options, sender) = (&go, &done, &loading, &options, sender.clone());
            let model = &model;
            s.spawn(move || {
                let mut g = {
                    let _one = loading.lock().expect("the loading lock");
                    generator(model, part, prompt, new, precision)
                };
                let mine = prompts(part, prompt, i * part);
                for _ in 0..ROUNDS {
                    go.wait();
                    let run = g.generate(&mine, options, |_, _| {}).expect("a part");
                    sender.send((i, run)).expect("the main thread");
                    done.wait();
                }
            });
        }
        for round in 0..ROUNDS {
            let g = whole.generate(&prompts(batch, prompt, 0), &options, |_, _| {}).expect("whole");
            line(&format!("round {round} one generator of {batch}"), &g, batch);
            let one = alone.generate(&prompts(part, prompt, 0), &options, |_, _| {}).expect("alone");
            line(&format!("round {round} one generator of {part}, alone"), &one, part);
            go.wait();
            let started = Instant::now();
            done.wait();
            let wall = started.elapsed().as_secs_f64();
            let mut runs: Vec<(usize, Generation)> = results.try_iter().collect();
            runs.sort_by_key(|r| r.0);
            for (i, g) in &runs {
                line(&format!("round {round} part {i} of {parts}, side by side"), g, part);
            }
            let summed: f64 = runs.iter().map(|(_, g)| g.tokens_per_second(part)).sum();
            let tokens: usize = runs.iter().map(|(_, g)| g.tokens.iter().map(Vec::len).sum::<usize>()).sum();
            println!(
                "round {round} parts side by side: {summed:.0} tokens/s summed; {tokens} tokens in {:.1} ms of \
                 wall time (prompt steps included) = {:.0} tokens/s",
                wall * 1e3,
                tokens as f64 / wall
            );
        }
    });
}
