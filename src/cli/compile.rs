//! `fusec compile`: ONNX model to bundle.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use fusec::ir::DType;
use fusec::CompileOptions;

use super::shapes::ShapeArgs;

/// Compile an ONNX model into a bundle: fused CUDA kernels (PTX when NVRTC is installed,
/// sources otherwise) plus cuBLAS calls, with the weights.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec compile models/bert_ts.onnx -o bert.bundle --dim batch=8 --dim seq=64\n  fusec compile models/mlp_block.onnx -o mlp.bundle --input x:4x7x40 --no-fuse --emit-cuda cuda/"
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
    /// Write every generated kernel's CUDA source into this directory.
    #[arg(long, value_name = "DIR")]
    emit_cuda: Option<PathBuf>,
    /// GPU architecture to compile PTX for.
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Print each stage's time and the process's peak memory so far (on stderr).
    #[arg(short, long)]
    verbose: bool,
}

/// The process's peak resident memory so far, in bytes (Linux; `None` elsewhere).
fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Compile {
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        let precision = match self.precision.as_str() {
            "fp16" => DType::F16,
            "bf16" => DType::BF16,
            "fp32" => DType::F32,
            other => bail!("--precision {other}: use fp32, fp16 or bf16"),
        };
        let options = CompileOptions {
            import: self.shapes.options(),
            no_fuse: self.no_fuse,
            arch: Some(self.arch.clone()),
            emit_cuda: self.emit_cuda.clone(),
            precision,
        };
        let clock = std::time::Instant::now();
        let mut last = 0.0;
        let verbose = self.verbose;
        let mut report = |stage: &str| {
            if verbose {
                let now = clock.elapsed().as_secs_f64();
                let peak = peak_memory().map_or(String::new(), |b| format!(", peak memory {} MB", b >> 20));
                eprintln!("{stage:>8}: {:6.3} s (at {now:.3} s{peak})", now - last);
                last = now;
            }
        };
        let bundle = fusec::compile_reporting(&self.model, &options, &mut report)?;
        bundle.save(&self.output)?;
        report("save");
        let h = &bundle.header;
        let ptx = match &h.arch {
            Some(arch) => format!("PTX for {arch}"),
            None => "CUDA sources only (NVRTC not found: the runtime compiles them at load)".into(),
        };
        println!(
            "{}: {} kernels, {} launches per run ({} cuBLAS GEMMs), {} graph breaks; {} weight bytes, {} activation bytes at peak; {ptx}",
            self.output.display(),
            h.kernels,
            h.launches,
            h.gemm_calls,
            h.graph_breaks,
            bundle.weights.len(),
            h.arena_bytes
        );
        Ok(ExitCode::SUCCESS)
    }
}
