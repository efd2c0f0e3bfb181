//! `--input` and `--dim`, shared by every subcommand that imports a model.

use clap::Args;
use fusec::import::{DimSpec, ImportOptions, InputSpec};
use fusec::ir::DType;

/// The element type a `--precision` value names (clap admits only these three).
pub fn precision(name: &str) -> DType {
    match name {
        "fp16" => DType::F16,
        "bf16" => DType::BF16,
        _ => DType::F32,
    }
}

/// Where `--json FILE` goes: `-` is standard output.
pub fn write_json(path: &std::path::Path, value: &serde_json::Value) -> anyhow::Result<()> {
    use anyhow::Context;
    let text = serde_json::to_string_pretty(value)? + "\n";
    if path.as_os_str() == "-" {
        print!("{text}");
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[derive(Debug, Clone, Args)]
pub struct ShapeArgs {
    /// Concrete shape (and optionally type) of an input: NAME:DIMxDIM[:TYPE], e.g.
    /// input_ids:8x128:i64. Repeat for several inputs.
    #[arg(long = "input", value_name = "NAME:SHAPE[:TYPE]")]
    pub inputs: Vec<InputSpec>,
    /// Value of a symbolic dimension of the model's inputs, e.g. --dim batch=8 --dim seq=128.
    #[arg(long = "dim", value_name = "NAME=N")]
    pub dims: Vec<DimSpec>,
}

impl ShapeArgs {
    pub fn options(&self) -> ImportOptions {
        ImportOptions::new(self.inputs.clone(), self.dims.clone())
    }
}
