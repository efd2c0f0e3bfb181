//! `fusec inspect`: what a model holds and what import makes of it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use fusec::fusion::FusionReport;
use fusec::import::{self, DeclaredDim, SHAPE_OPS};
use fusec::picture::{self, abbreviated, human_bytes, JSON_SCHEMA_VERSION};
use fusec::plan::Plan;
use fusec::{ir, CompileOptions};

use super::shapes::{json_to_stdout, precision, write_json, ShapeArgs};

/// Show a model's inputs, outputs, weights and op histogram before and after import; with
/// --fused, --dot, --svg or --json, also the program `fusec compile` would make of it.
///
/// Exits non-zero if the model holds ops fusec does not support (they are listed).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16\n  fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16 --fused\n  fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16 --svg bert.svg\n  fusec inspect models/mlp_block.onnx --input x:4x7x40 --dot mlp.dot --json mlp.json\n  fusec inspect models/mlp_block.onnx --input x:4x7x40 --json - | jq .program.launches\n  fusec inspect models/mlp_block.onnx --input x:4x7x40 --dump"
)]
pub struct Inspect {
    /// The ONNX model, or a bundle (`.bundle`: its header is shown).
    model: PathBuf,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Also print the imported IR graph.
    #[arg(long)]
    dump: bool,
    /// List the program's kernels: what each is and which ONNX nodes it covers.
    #[arg(long)]
    fused: bool,
    /// Show the unfused baseline instead (one kernel per node) in --fused, --dot, --svg, --json.
    #[arg(long)]
    no_fuse: bool,
    /// Element type of the program shown (as `fusec compile --precision`).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16", "bf16"])]
    precision: String,
    /// Show the program with a decoder's key/value cache updated in place (as `fusec compile
    /// --cache-in-place`): each `present = Concat(past, new)` an append.
    #[arg(long)]
    cache_in_place: bool,
    /// Write the program as a Graphviz DOT graph: each kernel a coloured cluster with its
    /// launch number, kind, the ONNX nodes it covers and its estimated bytes; GEMMs in bold.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Render that graph as SVG (needs Graphviz's `dot` on PATH).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Draw only these launches in --dot/--svg, e.g. 2..8 (inclusive; numbers as --fused lists them).
    #[arg(long, value_name = "FIRST..LAST", value_parser = parse_launches)]
    launches: Option<std::ops::RangeInclusive<usize>>,
    /// Write what is shown as JSON (schema in `docs/json.md`; `-` for standard output, which then
    /// carries only the JSON).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn histogram(counts: &BTreeMap<String, usize>) -> String {
    counts.iter().map(|(op, n)| format!("{op} {n}")).collect::<Vec<_>>().join(", ")
}

fn declared_shape(dims: &Option<Vec<DeclaredDim>>) -> String {
    let Some(dims) = dims else { return "?".into() };
    let dims: Vec<String> = dims
        .iter()
        .map(|d| match d {
            DeclaredDim::Fixed(v) => v.to_string(),
            DeclaredDim::Symbolic(s) => s.clone(),
            DeclaredDim::Unknown => "?".into(),
        })
        .collect();
    format!("[{}]", dims.join(","))
}

fn parse_launches(text: &str) -> Result<std::ops::RangeInclusive<usize>, String> {
    let (first, last) = text.split_once("..").unwrap_or((text, text));
    let number = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|_| format!("'{text}': expected FIRST..LAST, e.g. 2..8, or one launch number"))
    };
    let (first, last) = (number(first)?, number(last)?);
    if first > last {
        return Err(format!("'{text}': the first launch is after the last"));
    }
    Ok(first..=last)
}

fn dims_json(dims: &Option<Vec<DeclaredDim>>) -> serde_json::Value {
    match dims {
        None => serde_json::Value::Null,
        Some(dims) => dims
            .iter()
            .map(|d| match d {
                DeclaredDim::Fixed(v) => serde_json::json!(v),
                DeclaredDim::Symbolic(s) => serde_json::json!(s),
                DeclaredDim::Unknown => serde_json::Value::Null,
            })
            .collect(),
    }
}

impl Inspect {
    /// A bundle's header: what it was compiled from and how, what it takes and gives (with
    /// its range of sizes), its program's size.
    fn bundle(&self, say: &dyn Fn(String)) -> anyhow::Result<ExitCode> {
        let program_flags = [
            (self.dump, "--dump"),
            (self.fused, "--fused"),
            (self.no_fuse, "--no-fuse"),
            (self.cache_in_place, "--cache-in-place"),
            (self.dot.is_some(), "--dot"),
            (self.svg.is_some(), "--svg"),
            (self.launches.is_some(), "--launches"),
        ];
        if let Some((_, flag)) = program_flags.iter().find(|(given, _)| *given) {
            anyhow::bail!(
                "{flag} shows the program made from an ONNX model; for a bundle, inspect shows its header (run {flag} on the model it was compiled from)"
            );
        }
        let bundle = fusec::Bundle::load(&self.model)?;
        let h = &bundle.header;
        let functions = super::shapes::functions(h);
        say(format!("bundle      {} (format {})", self.model.display(), h.format_version));
        say(format!("model       {}", h.model));
        say(format!(
            "program     {}, {}, {} kernels ({} distinct functions), {} launches per run ({}{}), {} graph breaks",
            h.precision,
            if h.fused { "fused" } else { "unfused" },
            h.kernels,
            functions.len(),
            h.launches,
            super::shapes::library_calls(h),
            super::shapes::few_row_text(h),
            h.graph_breaks
        ));
        say(format!("PTX         {}", h.arch.as_deref().unwrap_or("none (CUDA sources, compiled at load)")));
        say(format!(
            "memory      {} weight bytes, {} activation bytes at peak",
            bundle.weights.len(),
            h.arena_bytes
        ));
        for r in &h.ranges {
            say(format!("range       {r} (memory for {})", r.high));
        }
        if h.ranges.is_empty() {
            say("range       none: one size".into());
        }
        for (kind, specs) in [("input", &h.inputs), ("output", &h.outputs)] {
            for s in specs {
                let inside = s.inside.as_ref().map(|i| format!(" (in place, inside {})", i.output));
                say(format!(
                    "{kind:<11} {} {}{}{}",
                    s.name,
                    s.dtype,
                    s.shape_text(&h.ranges),
                    inside.unwrap_or_default()
                ));
            }
        }
        if let Some(path) = &self.json {
            let doc = super::shapes::bundle_json(
                &bundle,
                serde_json::json!({
                    "schema": "fusec-inspect-bundle",
                    "schema_version": JSON_SCHEMA_VERSION,
                    "bundle": self.model.display().to_string(),
                    "format": h.format_version,
                    "model": h.model,
                    "precision": h.precision,
                }),
            );
            write_json(path, &doc)?;
        }
        Ok(ExitCode::SUCCESS)
    }

    fn print_kernels(plan: &Plan, report: Option<&FusionReport>, onnx_nodes: usize) {
        if let Some(r) = report {
            println!("fusion      {r}");
            println!("fused ops   {}", histogram(&plan.graph.op_histogram()));
        }
        let gemms = plan.gemm_calls();
        println!(
            "kernels     {} ({gemms} cuBLAS GEMMs), {} graph breaks, for {onnx_nodes} ONNX nodes; {} moved per run (estimated)",
            plan.kernels.len(),
            plan.graph_breaks,
            human_bytes(plan.traffic_bytes())
        );
        for (i, kernel) in plan.kernels.iter().enumerate() {
            let writes: Vec<String> =
                kernel.outputs.iter().map(|&o| plan.graph.node(o).ty.to_string()).collect();
            println!(
                "  #{i:<3} {:<22} writes {:<28} {:>9}  covers {}: {}",
                kernel.kind.name(),
                writes.join(" "),
                human_bytes(plan.kernel_traffic_bytes(kernel)),
                kernel.covers.len(),
                abbreviated(&kernel.covers, 4)
            );
        }
    }

    pub fn execute(self) -> anyhow::Result<ExitCode> {
        let quiet = json_to_stdout(self.json.as_deref());
        let say = |line: String| {
            if !quiet {
                println!("{line}");
            }
        };
        if self.model.extension().is_some_and(|e| e == "bundle") {
            return self.bundle(&say);
        }
        let onnx = import::summarize(&self.model)?;
        say(format!("model       {}", onnx.path.display()));
        say(format!(
            "producer    {} (opset {})",
            if onnx.producer.is_empty() { "unknown" } else { &onnx.producer },
            onnx.opset
        ));
        say(format!("parameters  {} ({} bytes)", onnx.parameters, onnx.parameter_bytes));
        say(format!("ONNX nodes  {}: {}", onnx.node_count, histogram(&onnx.op_histogram)));
        let mut doc = serde_json::json!({
            "schema": "fusec-inspect",
            "schema_version": JSON_SCHEMA_VERSION,
            "model": self.model.display().to_string(),
            "producer": onnx.producer,
            "opset": onnx.opset,
            "parameters": onnx.parameters,
            "parameter_bytes": onnx.parameter_bytes,
            "onnx_nodes": onnx.node_count,
            "onnx_ops": onnx.op_histogram,
            "unsupported": onnx.unsupported.iter().map(|op| serde_json::json!({
                "node": op.node, "op_type": op.op_type, "domain": op.domain,
            })).collect::<Vec<_>>(),
        });
        if !onnx.unsupported.is_empty() {
            say(format!("unsupported ops: {}", onnx.unsupported.len()));
            for op in &onnx.unsupported {
                let domain = if op.domain.is_empty() { String::new() } else { format!("{}::", op.domain) };
                say(format!("  node '{}': {domain}{} (opset {})", op.node, op.op_type, onnx.opset));
            }
            if let Some(path) = &self.json {
                write_json(path, &doc)?;
            }
            return Ok(ExitCode::FAILURE);
        }
        say("unsupported ops: none".into());
        let import_options = self.shapes.options_with(&onnx)?;
        let model = import::import(&self.model, &import_options)?;
        // With ranges, the rest shows the program at the top of each range.
        let graph = &model.graph;
        let mut inputs = Vec::new();
        for (declared, &id) in onnx.inputs.iter().zip(graph.inputs()) {
            let node = graph.node(id);
            say(format!("input       {} {} -> {}", node.name, declared_shape(&declared.dims), node.ty));
            inputs.push(serde_json::json!({
                "name": node.name, "declared": dims_json(&declared.dims),
                "shape": node.ty.shape, "dtype": node.ty.dtype.to_string(),
            }));
        }
        let mut outputs = Vec::new();
        for (name, id) in graph.outputs() {
            let ty = &graph.node(*id).ty;
            say(format!("output      {name} {ty}"));
            outputs.push(serde_json::json!({"name": name, "shape": ty.shape, "dtype": ty.dtype.to_string()}));
        }
        let shape_ops: usize = SHAPE_OPS.iter().filter_map(|op| onnx.op_histogram.get(*op)).sum();
        let ir_ops = graph.op_histogram();
        say(format!(
            "IR nodes    {} after import ({} ONNX nodes folded into constants): {}",
            ir_ops.values().sum::<usize>(),
            model.folded_nodes,
            histogram(&ir_ops)
        ));
        say(format!(
            "shape ops   {shape_ops} in the file, {} left after folding",
            model.remaining_shape_ops()
        ));
        doc["inputs"] = inputs.into();
        doc["outputs"] = outputs.into();
        doc["ir_nodes"] = ir_ops.values().sum::<usize>().into();
        doc["folded_nodes"] = model.folded_nodes.into();
        if self.dump && !quiet {
            print!("{}", ir::dump(graph).context("dumping the IR")?);
        }
        if !import_options.ranges().is_empty() {
            let options = CompileOptions {
                import: import_options.clone(),
                precision: precision(&self.precision),
                cache_in_place: self.cache_in_place,
                ..Default::default()
            };
            let (plan, symbolic) = fusec::pipeline::plan_symbolic(&self.model, &options)?;
            say(format!(
                "ranges      {}: one program for every size; {} of {} values have sizes that follow them",
                symbolic.ranges(),
                symbolic.symbolic_nodes(),
                plan.graph.node_count()
            ));
            let mut values = Vec::new();
            for (kind, bindings) in [("input", &plan.inputs), ("output", &plan.outputs)] {
                for b in bindings {
                    say(format!("  {kind:<9} {} {}", b.name, symbolic.display(b.value)));
                    values.push(
                        serde_json::json!({"kind": kind, "name": b.name, "shape": symbolic.display(b.value)}),
                    );
                }
            }
            doc["ranges"] = serde_json::json!({
                "dims": super::shapes::ranges_json(&symbolic.symbols),
                "symbolic_values": symbolic.symbolic_nodes(),
                "values": plan.graph.node_count(),
                "io": values,
            });
        }
        if self.fused || self.dot.is_some() || self.svg.is_some() || self.json.is_some() {
            let options = CompileOptions {
                import: import_options,
                no_fuse: self.no_fuse,
                precision: precision(&self.precision),
                cache_in_place: self.cache_in_place,
                ..Default::default()
            };
            let (plan, report) = fusec::pipeline::plan_model(model, &self.model, &options, &mut |_| {})?;
            if self.fused && !quiet {
                Self::print_kernels(&plan, report.as_ref(), onnx.node_count);
            }
            if self.dot.is_some() || self.svg.is_some() {
                let title = format!(
                    "{} ({}, {})",
                    self.model.file_name().map_or_else(
                        || self.model.display().to_string(),
                        |n| n.to_string_lossy().into_owned()
                    ),
                    self.precision,
                    if self.no_fuse { "unfused" } else { "fused" }
                );
                if let Some(range) = &self.launches {
                    if *range.start() >= plan.kernels.len() {
                        anyhow::bail!(
                            "--launches {}..{}: the program has {} launches (0..{})",
                            range.start(),
                            range.end(),
                            plan.kernels.len(),
                            plan.kernels.len().saturating_sub(1)
                        );
                    }
                }
                let text = picture::dot(&plan, &title, self.launches.clone());
                if let Some(path) = &self.dot {
                    std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
                    say(format!("wrote {}", path.display()));
                }
                if let Some(path) = &self.svg {
                    picture::render_svg(&text, path)?;
                    say(format!("wrote {}", path.display()));
                }
            }
            doc["precision"] = self.precision.clone().into();
            doc["program"] = picture::program_json(&plan, !self.no_fuse);
        }
        if let Some(path) = &self.json {
            write_json(path, &doc)?;
            if !quiet {
                println!("wrote {}", path.display());
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
