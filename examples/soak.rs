//! Load and fault checks of the runtime on a GPU, for `tests/RELIABILITY.md`. Each mode prints
//! what it did and what happened, and exits non-zero when a check fails.
//!
//!     soak threads MODEL THREADS RUNS   # each thread its own session, RUNS runs: bitwise equal
//!                                       #   to one single-threaded run
//!     soak long MODEL RUNS              # one session: device and host memory at start and end,
//!                                       #   run_into latency median and p99 (beside run's,
//!                                       #   and the host's own noise)
//!     soak two MODEL RUNS               # two sessions from one bundle, runs interleaved
//!     soak churn MODEL THREADS SESSIONS # threads making, running once and dropping sessions
//!     soak oom MODEL                    # GPU memory filled: session creation fails with the
//!                                       #   bytes, then succeeds once the memory is given back
//!
//! MODEL is compiled with batch=2 seq=16, or the dims in FUSEC_SOAK_DIMS (`batch=8,seq=128`), and
//! in fp16 where FUSEC_SOAK_FP16=1.

// The crash report of the GPU tests: where a crash happened, on a machine without a debugger.
#[path = "../tests/crash/mod.rs"]
mod crash;

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use fusec::import::{DimSpec, ImportOptions};
use fusec::ir::{DType, Tensor};
use fusec::runtime::{device_memory, RuntimeError};
use fusec::{Bundle, CompileOptions, Session};

type Outputs = Vec<(String, Tensor)>;

fn compile(model: &str) -> Result<(Bundle, Vec<(String, Tensor)>)> {
    let dims_text = std::env::var("FUSEC_SOAK_DIMS").unwrap_or_else(|_| "batch=2,seq=16".into());
    let dims: Vec<DimSpec> =
        dims_text.split(',').map(|d| d.parse().map_err(anyhow::Error::msg)).collect::<Result<_>>()?;
    let import = ImportOptions::new(vec![], dims);
    let precision =
        if std::env::var("FUSEC_SOAK_FP16").as_deref() == Ok("1") { DType::F16 } else { DType::F32 };
    let options = CompileOptions { import: import.clone(), precision, ..Default::default() };
    let bundle = fusec::compile(Path::new(model), &options)?;
    let reference = fusec::import::import(Path::new(model), &import)?;
    let inputs = reference
        .graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &id)| {
            let node = reference.graph.node(id);
            let (low, high) = if node.ty.dtype.is_float() { (-2.0, 2.0) } else { (1.0, 512.0) };
            (node.name.clone(), fusec::ir::random_input(&node.name, &node.ty, 11 + k as u64, low, high))
        })
        .collect();
    Ok((bundle, inputs))
}

/// Resident host memory in bytes (Linux).
fn host_rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<usize>().ok()).unwrap_or(0) * 4096
}

fn used_device_bytes() -> Result<usize> {
    let (free, total) = device_memory(0)?;
    Ok(total - free)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `work` on `threads` threads at once; the total of what they return (runs whose outputs
/// differ), or the first error.
fn on_threads(threads: usize, work: impl Fn() -> Result<usize, RuntimeError> + Sync) -> Result<usize> {
    let results: Vec<Result<usize, RuntimeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(&work)).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(RuntimeError::Input("thread panicked".into()))))
            .collect()
    });
    let mut differing = 0;
    for r in results {
        differing += r?;
    }
    Ok(differing)
}

fn threads(bundle: &Bundle, inputs: &[(String, Tensor)], threads: usize, runs: usize) -> Result<()> {
    let reference = Session::new(bundle, 0)?.run(inputs)?;
    let start = Instant::now();
    let differing = on_threads(threads, || {
        let mut session = Session::new(bundle, 0)?;
        let mut differing = 0;
        for _ in 0..runs {
            differing += usize::from(session.run(inputs)? != reference);
        }
        Ok(differing)
    })?;
    println!(
        "threads: {threads} threads x {runs} runs in {:.1} s; runs whose outputs differ bitwise from the single-threaded run: {differing}",
        start.elapsed().as_secs_f64()
    );
    ensure!(differing == 0, "{differing} runs differ");
    Ok(())
}

fn long(bundle: &Bundle, inputs: &[(String, Tensor)], runs: usize) -> Result<()> {
    let mut session = Session::new(bundle, 0)?;
    let reference: Outputs = session.run(inputs)?;
    let mut outputs: Vec<Tensor> = reference.iter().map(|(_, t)| t.clone()).collect();
    for _ in 0..100 {
        session.run_into(inputs, &mut outputs)?;
    }
    let (device0, host0) = (used_device_bytes()?, host_rss());
    let mut times = Vec::with_capacity(runs);
    let mut differing = 0usize;
    let start = Instant::now();
    for i in 0..runs {
        let t = Instant::now();
        session.run_into(inputs, &mut outputs)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        // Comparing every run costs as much as a run on the host: every 100th.
        if i % 100 == 0 {
            differing += usize::from(outputs.iter().zip(&reference).any(|(a, (_, b))| a != b));
        }
    }
    let (device1, host1) = (used_device_bytes()?, host_rss());
    let elapsed = start.elapsed().as_secs_f64();
    let (median, p99, max) = spread(&times);
    let mb = |b: usize| b as f64 / 1e6;
    let median_of = |part: &[f64]| spread(part).0;
    println!(
        "long: {runs} runs of run_into in {elapsed:.1} s; device memory used {:.1} MB -> {:.1} MB; host RSS {:.1} MB -> {:.1} MB; latency median {median:.4} ms, p99 {p99:.4} ms ({:.2}x), max {max:.4} ms; first/last 1,000 runs' median {:.4} / {:.4} ms; compared outputs differing: {differing}",
        mb(device0),
        mb(device1),
        mb(host0),
        mb(host1),
        p99 / median,
        median_of(&times[..times.len().min(1000)]),
        median_of(&times[times.len().saturating_sub(1000)..]),
    );
    // The same with run(), which allocates its outputs: a fifth as many runs.
    let mut allocating = Vec::with_capacity(runs / 5);
    for _ in 0..runs / 5 {
        let t = Instant::now();
        session.run(inputs)?;
        allocating.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (run_median, run_p99, _) = spread(&allocating);
    println!(
        "long: {} runs of run(): median {run_median:.4} ms, p99 {run_p99:.4} ms ({:.2}x)",
        runs / 5,
        run_p99 / run_median
    );
    // The host's own noise: a busy wait of the median's length timed the same way, as many
    // times. What it shows in its tail is the machine, not fusec.
    let wait = std::time::Duration::from_secs_f64(median / 1e3);
    let mut idle = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        while t.elapsed() < wait {
            std::hint::spin_loop();
        }
        idle.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (idle_median, idle_p99, idle_max) = spread(&idle);
    println!(
        "long: host noise, a {:.4} ms busy wait timed {runs} times: median {idle_median:.4} ms, p99 {idle_p99:.4} ms ({:.2}x), max {idle_max:.4} ms",
        median,
        idle_p99 / idle_median
    );
    // The same runs timed on the GPU (CUDA events around each graph replay, inputs already
    // uploaded): what the GPU does, without the host's part.
    let gpu = session.time_runs(&[inputs.to_vec()], 100, runs)?;
    let (gpu_median, gpu_p99, _) = spread(&gpu);
    println!(
        "long: {runs} runs timed with CUDA events: median {gpu_median:.4} ms, p99 {gpu_p99:.4} ms ({:.2}x); device memory used after them {:.1} MB",
        gpu_p99 / gpu_median,
        mb(used_device_bytes()?)
    );
    ensure!(differing == 0, "{differing} compared runs differ");
    ensure!(device1 <= device0 + (1 << 20), "device memory grew by {} bytes", device1 - device0);
    ensure!(host1 <= host0 + (16 << 20), "host memory grew by {} bytes", host1 - host0);
    ensure!(p99 <= 1.5 * median, "p99 {p99:.4} ms is over 1.5x the median {median:.4} ms");
    Ok(())
}

/// Median, p99 and maximum of `times`.
fn spread(times: &[f64]) -> (f64, f64, f64) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    (percentile(&sorted, 0.5), percentile(&sorted, 0.99), sorted.last().copied().unwrap_or(0.0))
}

fn two(bundle: &Bundle, inputs: &[(String, Tensor)], runs: usize) -> Result<()> {
    let mut a = Session::new(bundle, 0)?;
    let mut b = Session::new(bundle, 0)?;
    let reference = a.run(inputs)?;
    let mut differing = 0;
    for _ in 0..runs {
        differing += usize::from(b.run(inputs)? != reference);
        differing += usize::from(a.run(inputs)? != reference);
    }
    println!("two: two sessions of one bundle, {runs} runs each, interleaved; runs differing: {differing}");
    ensure!(differing == 0, "{differing} runs differ");
    Ok(())
}

fn churn(bundle: &Bundle, inputs: &[(String, Tensor)], threads: usize, sessions: usize) -> Result<()> {
    let reference = Session::new(bundle, 0)?.run(inputs)?;
    let start = Instant::now();
    let differing = on_threads(threads, || {
        let mut differing = 0;
        for k in 0..sessions {
            let mut session = Session::new(bundle, 0)?;
            // Some sessions capture a graph (a second run), some do not.
            for _ in 0..1 + k % 3 {
                differing += usize::from(session.run(inputs)? != reference);
            }
        }
        Ok(differing)
    })?;
    println!(
        "churn: {threads} threads x {sessions} sessions made, run 1-3 times and dropped, in {:.1} s; runs differing: {differing}",
        start.elapsed().as_secs_f64()
    );
    ensure!(differing == 0, "{differing} runs differ");
    Ok(())
}

fn oom(bundle: &Bundle, inputs: &[(String, Tensor)]) -> Result<()> {
    use cudarc::driver::CudaContext;
    let needed = bundle.header.arena_bytes + bundle.weights.len();
    let reference = Session::new(bundle, 0)?.run(inputs)?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    // Fill the GPU in 1 GiB blocks, then in smaller ones, until less than the session needs
    // is left.
    let mut filler = Vec::new();
    let mut block = 1usize << 30;
    loop {
        let (free, _) = device_memory(0)?;
        if free < needed / 2 {
            break;
        }
        while block > free.saturating_sub(needed / 4) && block > 1 << 16 {
            block /= 2;
        }
        match stream.alloc_zeros::<u8>(block) {
            Ok(b) => filler.push(b),
            Err(_) if block > 1 << 16 => block /= 2,
            // What the driver reports free is not all to be had in blocks: full.
            Err(_) => break,
        }
    }
    let (free, total) = device_memory(0)?;
    println!("oom: GPU filled, {free} of {total} bytes free; the session needs {needed}");
    match Session::new(bundle, 0) {
        Ok(_) => bail!("a session was made with {free} bytes free"),
        Err(e) => {
            println!("oom: Session::new failed: {e}");
            ensure!(matches!(e, RuntimeError::OutOfMemory { .. }), "not an out-of-memory error: {e:?}");
        }
    }
    drop(filler);
    stream.synchronize()?;
    let outputs =
        Session::new(bundle, 0).context("a session after the memory was given back")?.run(inputs)?;
    ensure!(outputs == reference, "the session made after the failure gives other outputs");
    println!("oom: memory given back; a new session runs and matches the earlier outputs bitwise");
    Ok(())
}

fn main() -> Result<()> {
    crash::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> Result<usize> {
        args.get(i)
            .with_context(|| format!("argument {i} missing (see the header of examples/soak.rs)"))?
            .parse()
            .context("a count")
    };
    let (Some(mode), Some(model)) = (args.first(), args.get(1)) else {
        bail!("usage: soak threads|long|two|churn|oom MODEL [COUNTS] (see examples/soak.rs)");
    };
    if !fusec::runtime::driver_available() {
        println!("soak: no CUDA driver on this machine; nothing run");
        return Ok(());
    }
    let (bundle, inputs) = compile(model)?;
    match mode.as_str() {
        "threads" => threads(&bundle, &inputs, number(2)?, number(3)?),
        "long" => long(&bundle, &inputs, number(2)?),
        "two" => two(&bundle, &inputs, number(2)?),
        "churn" => churn(&bundle, &inputs, number(2)?, number(3)?),
        "oom" => oom(&bundle, &inputs),
        other => bail!("unknown mode {other}"),
    }
}
