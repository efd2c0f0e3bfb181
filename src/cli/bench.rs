//! `fusec bench`: fused versus unfused latency on the GPU, side by side.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use fusec::bundle::IoSpec;
use fusec::import::InputSpec;
use fusec::ir::{random_tensor, rel_l2, DType, Tensor};
use fusec::runtime::{Session, SessionOptions};
use fusec::{Bundle, CompileOptions};

use super::shapes::ShapeArgs;

/// Compare fused and unfused latency on the GPU: compile the model twice (fused, with a CUDA
/// graph; unfused, one kernel per node and no graph), check their outputs agree, then time
/// both with CUDA events after a warm-up, rotating input sets.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec bench models/bert_ts.onnx --dim batch=8 --dim seq=64\n  fusec bench bert.bundle --iters 500 --json bert.json"
)]
pub struct Bench {
    /// An ONNX model, or a bundle (its source model is compiled again unfused).
    model: PathBuf,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Element type of weights and activations (for an ONNX model).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16", "bf16"])]
    precision: String,
    /// Timed runs of each variant.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Untimed runs first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Also write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The GPU to run on.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

/// Median, 10th and 90th percentile of `times`.
fn percentiles(times: &mut [f64]) -> (f64, f64, f64) {
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// Four random, non-zero input sets (token ids below 16, floats in [-1, 1)).
fn input_sets(inputs: &[IoSpec]) -> anyhow::Result<Vec<Vec<(String, Tensor)>>> {
    (0..4u64)
        .map(|set| {
            inputs
                .iter()
                .enumerate()
                .map(|(k, spec)| {
                    let ty = spec
                        .tensor_type()
                        .with_context(|| format!("input {} has type {}", spec.name, spec.dtype))?;
                    let (low, high) = if ty.dtype.is_float() { (-1.0, 1.0) } else { (1.0, 16.0) };
                    Ok((spec.name.clone(), random_tensor(&ty, 1000 * set + k as u64, low, high)))
                })
                .collect()
        })
        .collect()
}

impl Bench {
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        if !fusec::runtime::driver_available() {
            bail!("fusec bench needs an NVIDIA GPU: no CUDA driver (libcuda.so) was found on this machine");
        }
        let precision = match self.precision.as_str() {
            "fp16" => DType::F16,
            "bf16" => DType::BF16,
            _ => DType::F32,
        };
        let (fused, onnx, import) = if self.model.extension().is_some_and(|e| e == "onnx") {
            let import = self.shapes.options();
            eprintln!("compiling {} (fused)…", self.model.display());
            let options = CompileOptions { import: import.clone(), precision, ..Default::default() };
            (fusec::compile(&self.model, &options)?, self.model.clone(), import)
        } else {
            let bundle = Bundle::load(&self.model)?;
            let specs = bundle
                .header
                .inputs
                .iter()
                .map(|i| InputSpec {
                    name: i.name.clone(),
                    shape: i.shape.clone(),
                    dtype: DType::from_name(&i.dtype),
                })
                .collect();
            let onnx = PathBuf::from(&bundle.header.model);
            (bundle, onnx, fusec::import::ImportOptions::new(specs, vec![]))
        };
        eprintln!("compiling {} (unfused)…", onnx.display());
        let options =
            CompileOptions { import, no_fuse: true, precision: fused.header.precision, ..Default::default() };
        let unfused = fusec::compile(&onnx, &options)?;
        let sets = input_sets(&fused.header.inputs)?;
        eprintln!("loading and checking…");
        let mut fast = Session::new(&fused, self.device)?;
        let mut slow = Session::with_options(&unfused, self.device, SessionOptions { cuda_graph: false })?;
        let tolerance = if fused.header.precision == DType::F32 { 1e-5 } else { 1e-2 };
        let (a, b) = (fast.run(&sets[0])?, slow.run(&sets[0])?);
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            let err = rel_l2(x, y);
            if err.is_nan() || err > tolerance {
                bail!("fused and unfused outputs differ on {name}: rel-L2 {err:e} (tolerance {tolerance:e})");
            }
        }
        eprintln!("timing {} runs of each…", self.iters);
        let mut rows = Vec::new();
        for (label, bundle, session) in [("unfused", &unfused, &mut slow), ("fused", &fused, &mut fast)] {
            let mut times = session.time_runs(&sets, self.warmup, self.iters.max(1))?;
            let (median, p10, p90) = percentiles(&mut times);
            rows.push((label, bundle.header.clone(), median, p10, p90));
        }
        println!(
            "{} on {} ({} runs after {} warm-up, CUDA events)",
            onnx.display(),
            fast.arch,
            self.iters,
            self.warmup
        );
        println!(
            "{:<9} {:>12} {:>10} {:>10} {:>9} {:>7} {:>13}",
            "", "median (ms)", "p10", "p90", "launches", "cuBLAS", "graph breaks"
        );
        for (label, h, median, p10, p90) in &rows {
            println!(
                "{label:<9} {median:>12.4} {p10:>10.4} {p90:>10.4} {:>9} {:>7} {:>13}",
                h.launches, h.gemm_calls, h.graph_breaks
            );
        }
        let speedup = rows[0].2 / rows[1].2;
        println!("speedup (unfused / fused median): {speedup:.2}x");
        if let Some(path) = &self.json {
            let json = serde_json::json!({
                "model": onnx.display().to_string(),
                "arch": fast.arch,
                "precision": fused.header.precision,
                "iterations": self.iters,
                "warmup": self.warmup,
                "speedup": speedup,
                "variants": rows.iter().map(|(label, h, median, p10, p90)| serde_json::json!({
                    "variant": label, "median_ms": median, "p10_ms": p10, "p90_ms": p90,
                    "kernels": h.kernels, "launches": h.launches, "gemm_calls": h.gemm_calls, "graph_breaks": h.graph_breaks,
                })).collect::<Vec<_>>(),
            });
            std::fs::write(path, serde_json::to_string_pretty(&json)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}
