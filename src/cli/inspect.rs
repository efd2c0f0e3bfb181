//! `fusec inspect`: what a model holds and what import makes of it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use fusec::fusion::{self, FusionLimits, Mode};
use fusec::import::{self, DeclaredDim, SHAPE_OPS};
use fusec::{ir, passes};

use super::shapes::ShapeArgs;

/// Show a model's inputs, outputs, weights and op histogram before and after import.
///
/// Exits non-zero if the model holds ops fusec does not support (they are listed).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16\n  fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16 --fused\n  fusec inspect models/mlp_block.onnx --input x:4x7x40 --dump"
)]
pub struct Inspect {
    /// The ONNX model.
    model: PathBuf,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Also print the imported IR graph.
    #[arg(long)]
    dump: bool,
    /// Fuse the model and list its kernels: what each is and which ONNX nodes it covers.
    #[arg(long)]
    fused: bool,
    /// With --fused: partition without fusion, one kernel per node (the unfused baseline).
    #[arg(long, requires = "fused")]
    no_fuse: bool,
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

/// The first few names of a list, and how many more there are.
fn abbreviated(names: &[String], shown: usize) -> String {
    let mut text = names.iter().take(shown).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > shown {
        text.push_str(&format!(", … ({} more)", names.len() - shown));
    }
    text
}

impl Inspect {
    fn print_kernels(&self, model: &import::Model) -> anyhow::Result<()> {
        let mut graph = model.graph.clone();
        passes::run_passes(&mut graph, &passes::standard())?;
        let (part, graph) = if self.no_fuse {
            (fusion::partition(&model.graph, &HashMap::new(), Mode::OneKernelPerNode)?, model.graph.clone())
        } else {
            let fused = fusion::fuse(&graph, &FusionLimits::default())?;
            let r = &fused.report;
            println!(
                "fusion      {} after {} iterations ({} e-nodes, {} classes): saturation {:.1} ms, extraction {:.1} ms",
                r.stop_reason,
                r.iterations,
                r.egraph_nodes,
                r.egraph_classes,
                r.saturation_time.as_secs_f64() * 1e3,
                r.extraction_time.as_secs_f64() * 1e3
            );
            println!("fused ops   {}", histogram(&fused.histogram()));
            (fusion::partition(&fused.graph, &fused.covers, Mode::Fused)?, fused.graph)
        };
        println!(
            "kernels     {} ({} cuBLAS GEMMs), {} graph breaks, for {} ONNX nodes",
            part.launches(),
            part.gemm_calls(),
            part.graph_breaks,
            model.onnx.node_count
        );
        for (i, kernel) in part.kernels.iter().enumerate() {
            let writes: Vec<String> = kernel.outputs.iter().map(|&o| graph.node(o).ty.to_string()).collect();
            println!(
                "  #{i:<3} {:<22} writes {:<28} covers {}: {}",
                kernel.kind.name(),
                writes.join(" "),
                kernel.covers.len(),
                abbreviated(&kernel.covers, 4)
            );
        }
        Ok(())
    }

    pub fn execute(self) -> anyhow::Result<ExitCode> {
        let onnx = import::summarize(&self.model)?;
        println!("model       {}", onnx.path.display());
        println!(
            "producer    {} (opset {})",
            if onnx.producer.is_empty() { "unknown" } else { &onnx.producer },
            onnx.opset
        );
        println!("parameters  {} ({} bytes)", onnx.parameters, onnx.parameter_bytes);
        println!("ONNX nodes  {}: {}", onnx.node_count, histogram(&onnx.op_histogram));
        if !onnx.unsupported.is_empty() {
            println!("unsupported ops: {}", onnx.unsupported.len());
            for op in &onnx.unsupported {
                let domain = if op.domain.is_empty() { String::new() } else { format!("{}::", op.domain) };
                println!("  node '{}': {domain}{} (opset {})", op.node, op.op_type, onnx.opset);
            }
            return Ok(ExitCode::FAILURE);
        }
        println!("unsupported ops: none");
        let model = import::import(&self.model, &self.shapes.options())?;
        let graph = &model.graph;
        for (declared, &id) in onnx.inputs.iter().zip(graph.inputs()) {
            let node = graph.node(id);
            println!("input       {} {} -> {}", node.name, declared_shape(&declared.dims), node.ty);
        }
        for (name, id) in graph.outputs() {
            println!("output      {name} {}", graph.node(*id).ty);
        }
        let shape_ops: usize = SHAPE_OPS.iter().filter_map(|op| onnx.op_histogram.get(*op)).sum();
        let ir_ops = graph.op_histogram();
        println!(
            "IR nodes    {} after import ({} ONNX nodes folded into constants): {}",
            ir_ops.values().sum::<usize>(),
            model.folded_nodes,
            histogram(&ir_ops)
        );
        println!("shape ops   {shape_ops} in the file, {} left after folding", model.remaining_shape_ops());
        if self.dump {
            print!("{}", ir::dump(graph).context("dumping the IR")?);
        }
        if self.fused {
            self.print_kernels(&model)?;
        }
        Ok(ExitCode::SUCCESS)
    }
}
