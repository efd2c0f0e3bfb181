//! Shared by the integration tests: the fixtures in models/, the shapes to try them at, and
//! random inputs for them.
#![allow(dead_code)]

use std::path::PathBuf;

use fusec::import::{ImportOptions, Model};
use fusec::ir::{random_tensor, DType, Tensor};

/// A fixture in models/ (or in `$FUSEC_MODELS_DIR`, for test binaries run elsewhere).
pub fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("FUSEC_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    dir.join(file)
}

/// Symbolic dims to try each fixture at: batch 1 and 3, sequence 1 and 7 (and more).
pub fn shape_variants(file: &str) -> Vec<ImportOptions> {
    let text = |b, s| ImportOptions::default().dim("batch", b).dim("seq", s);
    if file.starts_with("vit") {
        return vec![ImportOptions::default().dim("batch", 1), ImportOptions::default().dim("batch", 3)];
    }
    if ["bert", "gpt2", "llama"].iter().any(|p| file.starts_with(p)) {
        return vec![text(1, 7), text(3, 1), text(2, 13)];
    }
    if file == "op_coverage.onnx" {
        return vec![ImportOptions::default()];
    }
    vec![ImportOptions::default().dim("batch", 1), ImportOptions::default().dim("batch", 3)]
}

/// Every fixture in models/.
pub fn all_fixtures() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(model_path(""))
        .expect("models/ exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".onnx"))
        .collect();
    files.sort();
    files
}

/// Random, non-zero inputs for every input of `model`: token ids below the fixtures'
/// vocabulary of 512, floats in [-2, 2).
pub fn random_inputs(model: &Model, seed: u64) -> Vec<(String, Tensor)> {
    model
        .graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let node = model.graph.node(id);
            let (low, high) = if node.ty.dtype == DType::I64 || node.ty.dtype == DType::I32 {
                (1.0, 512.0)
            } else {
                (-2.0, 2.0)
            };
            (node.name.clone(), random_tensor(&node.ty, seed + i as u64, low, high))
        })
        .collect()
}

/// ptxas: `$FUSEC_PTXAS`, the wheel that `.ci/run` installs under `.nvrtc/`, or `PATH`.
pub fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FUSEC_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let wheel = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".nvrtc/nvidia/cu13/bin/ptxas");
    if wheel.exists() {
        return Some(wheel);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join("ptxas"))
        .find(|p| p.exists())
}
