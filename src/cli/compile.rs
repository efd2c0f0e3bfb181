//! `fusec compile`: ONNX model to bundle.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fusec::CompileOptions;

use super::progress::{next_stage, Progress};
use super::shapes::ShapeArgs;

/// Compile an ONNX model into a bundle: fused CUDA kernels (PTX when NVRTC is installed,
/// sources otherwise) plus cuBLAS calls, with the weights.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec compile models/bert_ts.onnx -o bert.bundle --dim batch=8 --dim seq=64\n  fusec compile models/bert_ts.onnx -o bert16.bundle --dim batch=8 --dim seq=64 --precision fp16 -v\n  fusec compile models/bert_ts.onnx -o bert.bundle --dim batch=8 --dim seq=64 --json - | jq .launches\n  fusec compile models/mlp_block.onnx -o mlp.bundle --input x:4x7x40 --no-fuse --emit-cuda cuda/"
)]
pub struct Compile {
    /// The ONNX model.
    model: PathBuf,
    /// Where to write the bundle.
    #[arg(short, long)]
    output: PathBuf,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Element type of weights and activations; inputs and outputs stay fp32 and reductions
    /// accumulate in fp32.
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16", "bf16"])]
    precision: String,
    /// One kernel per node, no fusion (the baseline `fusec bench` compares against).
    #[arg(long)]
    no_fuse: bool,
    /// A decoder's key/value cache updated in place: each `present.*` output that is
    /// `Concat(past, new)` holds its `past_key_values.*` input in its own buffer, both in the
    /// storage type (fp16 in an fp16 build), and a step writes only the new positions. What
    /// `fusec generate` compiles; the cache inputs are then read from inside the outputs.
    #[arg(long)]
    cache_in_place: bool,
    /// Half-type builds keep an erf-GELU after a GEMM exact, in an epilogue kernel of its own
    /// (by default it is computed in its tanh form inside cuBLASLt's epilogue: at most 4.7e-4
    /// apart, rel-L2 2e-4 over unit-normal inputs, about f16's own rounding). Also
    /// `FUSEC_EXACT_GELU=1`.
    #[arg(long)]
    exact_gelu: bool,
    /// Write every generated kernel's CUDA source into this directory.
    #[arg(long, value_name = "DIR")]
    emit_cuda: Option<PathBuf>,
    /// GPU architecture to compile PTX for.
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// No progress line (there is none anyway when standard error is not a terminal).
    #[arg(short, long)]
    quiet: bool,
    /// Also write what was compiled as JSON (schema in `docs/json.md`; `-` for standard output,
    /// which then carries only the JSON).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The process's peak resident memory so far, in bytes (Linux; `None` elsewhere).
fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Compile {
    /// `verbose`: print each stage's time and the peak memory so far (`-v`).
    pub fn execute(self, verbose: bool) -> anyhow::Result<ExitCode> {
        let precision = super::shapes::precision(&self.precision);
        let options = CompileOptions {
            import: self.shapes.options_for(&self.model)?,
            no_fuse: self.no_fuse,
            cache_in_place: self.cache_in_place,
            exact_gelu: self.exact_gelu || CompileOptions::default().exact_gelu,
            arch: Some(self.arch.clone()),
            emit_cuda: self.emit_cuda.clone(),
            precision,
            ..Default::default()
        };
        let clock = std::time::Instant::now();
        let mut last = 0.0;
        let mut stages = Vec::new();
        let progress = Progress::new(self.quiet, &format!("importing {}", self.model.display()));
        let mut report = |stage: &str| {
            let now = clock.elapsed().as_secs_f64();
            stages.push(serde_json::json!({"stage": stage, "seconds": now - last}));
            if verbose {
                let peak = peak_memory().map_or(String::new(), |b| format!(", peak memory {} MB", b >> 20));
                progress.println(&format!("{stage:>8}: {:6.3} s (at {now:.3} s{peak})", now - last));
            }
            progress.set(next_stage(stage));
            last = now;
        };
        let bundle = fusec::compile_reporting(&self.model, &options, &mut report)?;
        bundle.save(&self.output)?;
        report("save");
        drop(progress);
        let h = &bundle.header;
        let ptx = match &h.arch {
            Some(arch) => format!("PTX for {arch}"),
            None => "CUDA sources only (NVRTC not found: the runtime compiles them at load)".into(),
        };
        let functions = super::shapes::functions(h);
        let quiet = super::shapes::json_to_stdout(self.json.as_deref());
        if !quiet {
            println!(
                "{}: {} kernels ({} distinct functions), {} launches per run ({}{}), {} graph breaks; {} weight bytes, {} activation bytes at peak; {ptx}",
                self.output.display(),
                h.kernels,
                functions.len(),
                h.launches,
                super::shapes::library_calls(h),
                super::shapes::few_row_text(h),
                h.graph_breaks,
                bundle.weights.len(),
                h.arena_bytes
            );
            if !h.ranges.is_empty() {
                let io: Vec<String> = h
                    .inputs
                    .iter()
                    .map(|i| format!("{} {}{}", i.name, i.dtype, i.shape_text(&h.ranges)))
                    .collect();
                let ranges: Vec<String> = h.ranges.iter().map(|r| r.to_string()).collect();
                let top: Vec<String> = h.ranges.iter().map(|r| format!("{}={}", r.symbol, r.high)).collect();
                println!(
                    "runs {} (activation bytes for {}): {}",
                    ranges.join(" "),
                    top.join(","),
                    io.join(", ")
                );
            }
        }
        if let Some(path) = &self.json {
            let doc = super::shapes::bundle_json(
                &bundle,
                serde_json::json!({
                    "schema": "fusec-compile",
                    "schema_version": fusec::picture::JSON_SCHEMA_VERSION,
                    "model": self.model.display().to_string(),
                    "bundle": self.output.display().to_string(),
                    "bundle_format": h.format_version,
                    "precision": self.precision,
                    "stages": stages,
                    "peak_memory_bytes": peak_memory(),
                }),
            );
            super::shapes::write_json(path, &doc)?;
        }
        Ok(ExitCode::SUCCESS)
    }
}
