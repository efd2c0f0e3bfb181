//! The Rust API end to end: compile an ONNX model, save and load the bundle, run it on the GPU
//! and compare the outputs with the CPU reference interpreter.
//!
//!     cargo run --release --example api                         # models/mlp_block.onnx, batch 4
//!     cargo run --release --example api -- MODEL.onnx batch=8 seq=128
//!
//! On a machine without a CUDA driver it compiles and stops there, saying so.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use fusec::import::{DimSpec, ImportOptions};
use fusec::ir::{random_tensor, rel_l2};
use fusec::{Bundle, CompileOptions, Session};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "models/mlp_block.onnx".into());
    let mut dims: Vec<DimSpec> =
        args.map(|d| d.parse().map_err(anyhow::Error::msg)).collect::<anyhow::Result<_>>()?;
    if dims.is_empty() {
        dims.push("batch=4".parse().map_err(anyhow::Error::msg)?);
    }
    let options = CompileOptions { import: ImportOptions::new(vec![], dims), ..Default::default() };

    // Compile, save, load: what `fusec compile` and `fusec run` do.
    let bundle = fusec::compile(Path::new(&model), &options)?;
    let path = std::env::temp_dir().join("fusec-api-example.bundle");
    bundle.save(&path)?;
    let bundle = Bundle::load(&path)?;
    let h = &bundle.header;
    println!(
        "{model}: {} kernels, {} launches per run, {} cuBLAS GEMMs",
        h.kernels, h.launches, h.gemm_calls
    );

    // Random non-zero inputs in the shapes the bundle was compiled for.
    let inputs: Vec<(String, fusec::ir::Tensor)> = h
        .inputs
        .iter()
        .enumerate()
        .map(|(k, spec)| {
            let ty = spec.tensor_type().with_context(|| format!("input {}", spec.name))?;
            let (low, high) = if ty.dtype.is_float() { (-1.0, 1.0) } else { (1.0, 16.0) };
            Ok((spec.name.clone(), random_tensor(&ty, 7 + k as u64, low, high)))
        })
        .collect::<anyhow::Result<_>>()?;

    if !fusec::runtime::driver_available() {
        println!("no CUDA driver on this machine: compiled and saved {}, not run", path.display());
        return Ok(());
    }
    let mut session = Session::new(&bundle, 0)?;
    let outputs = session.run(&inputs)?;

    // The same model on the CPU reference interpreter.
    let reference = fusec::import::import(Path::new(&model), &options.import)?;
    let feeds: HashMap<String, fusec::ir::Tensor> = inputs.iter().cloned().collect();
    let expected = fusec::ir::evaluate(&reference.graph, &feeds)?;
    let mut worst: f64 = 0.0;
    for ((name, got), (_, want)) in outputs.iter().zip(&expected) {
        let err = rel_l2(got, want);
        println!("output {name}: {} values, rel-L2 against the CPU reference {err:.2e}", got.len());
        worst = worst.max(err);
    }
    anyhow::ensure!(worst <= 1e-5, "the GPU outputs differ from the CPU reference (rel-L2 {worst:.2e})");
    println!("ok: GPU and CPU agree (rel-L2 ≤ 1e-5)");
    Ok(())
}
