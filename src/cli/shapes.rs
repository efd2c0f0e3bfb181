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

/// Whether `--json` names standard output (`-`), which then carries only the JSON.
pub fn json_to_stdout(json: Option<&std::path::Path>) -> bool {
    json.is_some_and(|p| p.as_os_str() == "-")
}

/// A bundle's inputs or outputs as JSON: name, shape and element type of each.
/// For a bundle with ranges, `shape` is at the top of the ranges and `dims` names how each
/// size follows them (`["batch", "seq*12"]`; null for a fixed shape).
pub fn io_json(
    specs: &[fusec::bundle::IoSpec],
    ranges: &[fusec::bundle::BundleRange],
) -> Vec<serde_json::Value> {
    specs
        .iter()
        .map(|i| {
            let dims = i.dims.as_ref().map(|d| d.iter().map(|d| d.display(ranges)).collect::<Vec<_>>());
            let inside = i.inside.as_ref().map(|i| &i.output);
            serde_json::json!({"name": i.name, "shape": i.shape, "dtype": i.dtype, "dims": dims, "inside": inside})
        })
        .collect()
}

/// Ranges of sizes as JSON: [{`name`, `low`, `high`}], and for a sum of others (`total=past+seq`)
/// `sum` (the parts given ranges) and `offset` (the parts of one size, added).
pub fn ranges_json(ranges: &[fusec::ir::DimRange]) -> serde_json::Value {
    ranges
        .iter()
        .map(|r| {
            let mut range = serde_json::json!({"name": r.symbol, "low": r.low, "high": r.high});
            if r.is_sum() {
                range["sum"] = serde_json::json!(r.sum);
                range["offset"] = serde_json::json!(r.offset);
            }
            range
        })
        .collect()
}

/// The distinct kernel functions of a bundle's program (the kernels for a few rows that GEMM
/// steps carry beside their library call not counted: [`few_row_kernels`]).
pub fn functions(h: &fusec::bundle::Header) -> std::collections::BTreeSet<&str> {
    h.steps.iter().flat_map(|s| s.program_sources()).map(|s| s.function.as_str()).collect()
}

/// GEMM steps that also carry a kernel for a few rows, which the runtime times against the
/// library call at load.
pub fn few_row_kernels(h: &fusec::bundle::Header) -> usize {
    h.steps.iter().filter(|s| matches!(s, fusec::codegen::Step::Gemm { skinny: Some(_), .. })).count()
}

/// `; 48 GEMMs also with a kernel for a few rows` where there are any.
pub fn few_row_text(h: &fusec::bundle::Header) -> String {
    match few_row_kernels(h) {
        0 => String::new(),
        n => format!("; {n} GEMMs also with a kernel for a few rows, chosen at load"),
    }
}

/// The library calls of a summary line: `8 cuBLAS GEMMs`, and `, 53 cuDNN convolutions` where
/// there are any (a generated loop is slower; a bundle that has none where a network has
/// convolutions shows it here).
pub fn library_calls(h: &fusec::bundle::Header) -> String {
    match h.conv_calls() {
        0 => format!("{} cuBLAS GEMMs", h.gemm_calls),
        n => format!("{} cuBLAS GEMMs, {n} cuDNN convolutions", h.gemm_calls),
    }
}

/// A bundle's program as `compile --json` and `inspect MODEL.bundle --json` give it, added to
/// `extra` (each document's own fields).
pub fn bundle_json(bundle: &fusec::Bundle, extra: serde_json::Value) -> serde_json::Value {
    let h = &bundle.header;
    let mut doc = extra;
    let program = serde_json::json!({
        "fused": h.fused,
        "arch": h.arch,
        "kernels": h.kernels,
        "functions": functions(h).len(),
        "few_row_kernels": few_row_kernels(h),
        "launches": h.launches,
        "gemm_calls": h.gemm_calls,
        "conv_calls": h.conv_calls(),
        "graph_breaks": h.graph_breaks,
        "weight_bytes": bundle.weights.len(),
        "activation_bytes": h.arena_bytes,
        "estimated_bytes": h.traffic_bytes,
        "flops": h.flops,
        "inputs": io_json(&h.inputs, &h.ranges),
        "outputs": io_json(&h.outputs, &h.ranges),
        "ranges": ranges_json(&h.ranges),
    });
    if let (Some(doc), serde_json::Value::Object(program)) = (doc.as_object_mut(), program) {
        doc.extend(program);
    }
    doc
}

/// Where `--json FILE` goes: `-` is standard output.
pub fn write_json(path: &std::path::Path, value: &serde_json::Value) -> anyhow::Result<()> {
    use anyhow::Context;
    let text = serde_json::to_string_pretty(value)? + "\n";
    if json_to_stdout(Some(path)) {
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
    /// Value of a symbolic dimension of the model's inputs, e.g. --dim batch=8 --dim seq=128;
    /// NAME=LO..HI gives a range (`inspect` checks that one program serves it); NAME=A+B the
    /// sum of two others (a decoder's --dim total=past+seq, inferred where past and seq are
    /// given), a range where a part is one. Sizes are at least 1 but a cache's length (past=0:
    /// nothing cached).
    #[arg(long = "dim", value_name = "NAME=N|NAME=LO..HI|NAME=A+B")]
    pub dims: Vec<DimSpec>,
}

impl ShapeArgs {
    pub fn options(&self) -> anyhow::Result<ImportOptions> {
        self.options_adding(None)
    }

    /// [`ShapeArgs::options`] for the ONNX model at `model`: given a decoder's cache length
    /// and the new tokens' (`--dim past=.. --dim seq=..`) but not its mask's, the mask's is
    /// their sum (`total=past+seq`, [`fusec::import::inferred_cache_sum_of`]), as though stated.
    pub fn options_for(&self, model: &std::path::Path) -> anyhow::Result<ImportOptions> {
        self.options_adding(fusec::import::inferred_cache_sum_of(model, &self.dims))
    }

    /// [`ShapeArgs::options_for`] for the model `summary` describes (already read).
    pub fn options_with(&self, summary: &fusec::import::OnnxSummary) -> anyhow::Result<ImportOptions> {
        self.options_adding(fusec::import::inferred_cache_sum(summary, &self.dims))
    }

    /// The dims given, with an inferred sum beside them (said on standard error), their sums
    /// resolved.
    fn options_adding(&self, inferred: Option<DimSpec>) -> anyhow::Result<ImportOptions> {
        if let Some(sum) = &inferred {
            eprintln!(
                "note: --dim {}={} (a decoder's mask covers its cache and the new tokens)",
                sum.symbol,
                sum.sum.join("+")
            );
        }
        let dims = self.dims.iter().cloned().chain(inferred).collect();
        let dims = fusec::import::resolve_sums(dims).map_err(anyhow::Error::msg)?;
        Ok(ImportOptions::new(self.inputs.clone(), dims))
    }
}
