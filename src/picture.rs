//! The picture of a compiled program, and its description as JSON: what `fusec inspect --dot`,
//! `--svg` and `--json` write.
//!
//! The picture is Graphviz DOT: each kernel launch a coloured cluster labelled with its launch
//! number, its kind, the ONNX nodes it covers and the bytes it is estimated to move; inside it
//! the IR nodes it computes. GEMMs (cuBLAS / cuBLASLt calls) have a bold border. Layout views
//! that cost no launch are dashed ovals outside every cluster; weights are left out (their
//! count is in each cluster's label). The graph's title gives the totals, graph breaks
//! included.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::path::Path;

use crate::fusion::KernelKind;
use crate::ir::{NodeId, Op};
use crate::plan::Plan;

/// Version of the JSON documents `inspect`, `compile` and `bench` write; raised whenever a
/// field changes meaning or goes away (new fields do not raise it).
pub const JSON_SCHEMA_VERSION: u32 = 1;

/// Fill colour of a kernel kind's cluster.
fn color(kind: &KernelKind) -> &'static str {
    match kind {
        KernelKind::Gemm { .. } => "#cfe2f3",
        KernelKind::Attention => "#f4cccc",
        KernelKind::RowReduction { .. } => "#d9ead3",
        KernelKind::Pointwise => "#fff2cc",
        KernelKind::Gather => "#ead1dc",
        KernelKind::Conv => "#d0e0e3",
        KernelKind::Copy => "#eeeeee",
        KernelKind::Single { .. } => "#fce5cd",
    }
}

/// `text` as a DOT string literal's contents.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Bytes for people: `532 B`, `4.2 KB`, `3.1 MB`.
pub fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b < 1000 => format!("{b} B"),
        b if b < 1_000_000 => format!("{:.1} KB", b as f64 / 1e3),
        b if b < 1_000_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b => format!("{:.2} GB", b as f64 / 1e9),
    }
}

/// The first `shown` names, then how many more.
pub fn abbreviated(names: &[String], shown: usize) -> String {
    let mut text = names.iter().take(shown).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > shown {
        let _ = write!(text, ", … ({} more)", names.len() - shown);
    }
    text
}

/// An ONNX node name short enough for a label: its last 40 characters.
fn short_name(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    match chars.len() {
        n if n <= 40 => name.to_string(),
        n => format!("…{}", chars[n - 39..].iter().collect::<String>()),
    }
}

/// The program of `plan` as Graphviz DOT, titled `title`; only the launches in `launches`
/// (all of them when `None`), with the views and inputs they read.
pub fn dot(plan: &Plan, title: &str, launches: Option<std::ops::RangeInclusive<usize>>) -> String {
    let graph = &plan.graph;
    let selected = |i: usize| launches.as_ref().is_none_or(|r| r.contains(&i));
    let mut out = String::new();
    let gemms = plan.gemm_calls();
    let _ = writeln!(out, "digraph fusec {{");
    let _ = writeln!(
        out,
        "  label=\"{}\\n{} launches ({} cuBLAS GEMMs), {} graph breaks, {} moved per run (estimated)\";",
        escape(title),
        plan.kernels.len(),
        gemms,
        plan.graph_breaks,
        human_bytes(plan.traffic_bytes())
    );
    let _ = writeln!(out, "  labelloc=t; rankdir=TB; fontname=\"Helvetica\"; compound=true;");
    let _ = writeln!(
        out,
        "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", fontsize=10];"
    );
    let _ = writeln!(out, "  edge [color=\"#555555\"];");
    let is_weight = |id: NodeId| matches!(graph.node(id).op, Op::Constant(_));
    let mut drawn: HashSet<NodeId> = HashSet::new();
    let mut kernel_of: HashMap<NodeId, usize> = HashMap::new();
    for (i, kernel) in plan.kernels.iter().enumerate() {
        if !selected(i) {
            continue;
        }
        let weights: HashSet<NodeId> =
            kernel.nodes.iter().flat_map(|&n| graph.inputs_of(n)).filter(|&input| is_weight(input)).collect();
        let gemm = matches!(kernel.kind, KernelKind::Gemm { .. });
        let _ = writeln!(out, "  subgraph cluster_{i} {{");
        let _ = writeln!(
            out,
            "    label=\"#{i} {}{}\\n{} ONNX node{}: {}\\n{}{}\";",
            escape(&kernel.kind.name()),
            if gemm { " (cuBLAS)" } else { "" },
            kernel.covers.len(),
            if kernel.covers.len() == 1 { "" } else { "s" },
            escape(&abbreviated(&kernel.covers.iter().map(|c| short_name(c)).collect::<Vec<_>>(), 2)),
            human_bytes(plan.kernel_traffic_bytes(kernel)),
            match weights.len() {
                0 => String::new(),
                n => format!(", {n} weight{}", if n == 1 { "" } else { "s" }),
            }
        );
        let _ = writeln!(
            out,
            "    style=\"filled{}\"; fillcolor=\"{}\"; penwidth={}; fontsize=10;",
            if gemm { ",bold" } else { ",rounded" },
            color(&kernel.kind),
            if gemm { 2.5 } else { 1.0 }
        );
        for &n in &kernel.nodes {
            let node = graph.node(n);
            let _ =
                writeln!(out, "    n{} [label=\"{}\\n{}\"];", n.index(), escape(&node.op.kind()), node.ty);
            drawn.insert(n);
            kernel_of.insert(n, i);
        }
        let _ = writeln!(out, "  }}");
    }
    let program_inputs: HashSet<NodeId> = graph.inputs().iter().copied().collect();
    let in_kernel: HashSet<NodeId> = plan.kernels.iter().flat_map(|k| k.nodes.iter().copied()).collect();
    // A view or input is drawn when a drawn kernel reads it or it is a view of a drawn value.
    let reads_of_drawn: HashSet<NodeId> = drawn.iter().flat_map(|&n| graph.inputs_of(n)).collect();
    let wanted = |id: NodeId| {
        if launches.is_none() || reads_of_drawn.contains(&id) {
            return true;
        }
        let mut at = id;
        while let Some(&source) = graph.inputs_of(at).first() {
            if drawn.contains(&source) {
                return true;
            }
            if in_kernel.contains(&source) || program_inputs.contains(&source) || is_weight(source) {
                return false;
            }
            at = source;
        }
        false
    };
    let others: Vec<NodeId> =
        graph.node_ids().filter(|&id| !drawn.contains(&id) && !is_weight(id) && wanted(id)).collect();
    for id in others {
        let node = graph.node(id);
        let launch = plan.kernels.iter().position(|k| k.nodes.contains(&id));
        let (shape, style) = match launch {
            _ if program_inputs.contains(&id) => ("box", "filled"),
            Some(_) => ("box", "dotted"),
            None => ("ellipse", "dashed"),
        };
        let label = match launch {
            _ if program_inputs.contains(&id) => format!("input {}\\n{}", escape(&node.name), node.ty),
            Some(k) => format!("{} in #{k}\\n{}", escape(&node.op.kind()), node.ty),
            None => format!("{} (view)\\n{}", escape(&node.op.kind()), node.ty),
        };
        let _ = writeln!(
            out,
            "  n{} [label=\"{label}\", shape={shape}, style=\"{style}\", fillcolor=\"#f3f3f3\"];",
            id.index()
        );
        drawn.insert(id);
    }
    for id in graph.node_ids() {
        if !drawn.contains(&id) {
            continue;
        }
        for input in graph.inputs_of(id) {
            if drawn.contains(&input) {
                // Edges inside one kernel stay light: the values never leave it.
                let inside = kernel_of.contains_key(&input) && kernel_of.get(&input) == kernel_of.get(&id);
                let attrs = if inside { " [color=\"#aaaaaa\"]" } else { "" };
                let _ = writeln!(out, "  n{} -> n{}{attrs};", input.index(), id.index());
            }
        }
    }
    for (k, (name, id)) in graph.outputs().iter().enumerate() {
        if !drawn.contains(id) {
            continue;
        }
        let _ = writeln!(
            out,
            "  out{k} [label=\"output {}\\n{}\", shape=box, style=filled, fillcolor=\"#f3f3f3\"];",
            escape(name),
            graph.node(*id).ty
        );
        let _ = writeln!(out, "  n{} -> out{k};", id.index());
    }
    let _ = writeln!(out, "}}");
    out
}

/// Why an SVG could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// No `dot` on PATH.
    #[error(
        "Graphviz's `dot` was not found on PATH, so {path} cannot be rendered: install Graphviz \
         (Debian/Ubuntu: apt install graphviz; macOS: brew install graphviz), or write the DOT \
         text with --dot FILE and render it elsewhere"
    )]
    NoDot {
        /// The SVG asked for.
        path: String,
    },
    /// `dot` ran and failed.
    #[error("Graphviz's `dot` failed to render {path}: {message}")]
    Failed {
        /// The SVG asked for.
        path: String,
        /// What `dot` said.
        message: String,
    },
}

/// Renders `dot_text` to an SVG file at `path` with Graphviz's `dot`.
pub fn render_svg(dot_text: &str, path: &Path) -> Result<(), RenderError> {
    use std::io::Write as _;
    let shown = path.display().to_string();
    let mut child = match std::process::Command::new("dot")
        .arg("-Tsvg")
        .arg("-o")
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(RenderError::NoDot { path: shown }),
        Err(e) => return Err(RenderError::Failed { path: shown, message: e.to_string() }),
    };
    let failed = |message: String| RenderError::Failed { path: shown.clone(), message };
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(dot_text.as_bytes()).map_err(|e| failed(e.to_string()))?;
    }
    let output = child.wait_with_output().map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(String::from_utf8_lossy(&output.stderr).trim().to_string()));
    }
    Ok(())
}

/// The program of `plan` as JSON (the `program` object of `fusec inspect --json`): totals and
/// one entry per kernel launch.
pub fn program_json(plan: &Plan, fused: bool) -> serde_json::Value {
    let graph = &plan.graph;
    let kernels: Vec<serde_json::Value> = plan
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            serde_json::json!({
                "launch": i,
                "kind": k.kind.name(),
                "gemm": matches!(k.kind, KernelKind::Gemm { .. }),
                "ir_nodes": k.nodes.iter().map(|&n| graph.node(n).op.kind()).collect::<Vec<_>>(),
                "covers": k.covers,
                "writes": k.outputs.iter().map(|&o| graph.node(o).ty.to_string()).collect::<Vec<_>>(),
                "estimated_bytes": plan.kernel_traffic_bytes(k),
            })
        })
        .collect();
    serde_json::json!({
        "fused": fused,
        "launches": plan.kernels.len(),
        "gemm_calls": plan.gemm_calls(),
        "graph_breaks": plan.graph_breaks,
        "estimated_bytes": plan.traffic_bytes(),
        "flops": plan.flops(),
        "activation_bytes": plan.arena_bytes,
        "weight_bytes": plan.weights.len(),
        "kernels": kernels,
    })
}

/// One bar of [`latency_svg`]: a label, the median and the p10–p90 whisker, in ms.
pub struct Bar {
    /// What the bar measures.
    pub label: String,
    /// Median, ms.
    pub median_ms: f64,
    /// 10th and 90th percentiles, ms (equal to the median where there are none).
    pub p10_ms: f64,
    /// See `p10_ms`.
    pub p90_ms: f64,
}

/// The latency plot `fusec bench --svg` writes: one horizontal bar per variant (unfused,
/// fused) with its p10–p90 whisker, then, when `steps` is not empty, one per profiled step of
/// the fused program (its GPU time), longest first. Linear scales, one per panel.
pub fn latency_svg(title: &str, variants: &[Bar], steps: &[Bar]) -> String {
    // The labels sit left of the bars: room for the longest (about 6.2 px a character at 11 px).
    let longest = variants.iter().chain(steps).map(|b| b.label.chars().count()).max().unwrap_or(0);
    let left = (16.0 + 6.2 * longest as f64).max(120.0);
    let (width, row, top) = (460.0, 18.0, 50.0);
    let panel_height = |n: usize| n as f64 * row + 40.0;
    let height = top
        + panel_height(variants.len())
        + if steps.is_empty() { 0.0 } else { panel_height(steps.len()) }
        + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">",
        left + width + 90.0
    );
    let _ = writeln!(out, "<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>", xml(title));
    let mut y = top;
    let panel = |out: &mut String, heading: &str, bars: &[Bar], color: &str, y: &mut f64| {
        let max = bars.iter().map(|b| b.p90_ms.max(b.median_ms)).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
        let _ = writeln!(out, "<text x=\"10\" y=\"{}\" font-weight=\"bold\">{}</text>", *y, xml(heading));
        *y += 10.0;
        for bar in bars {
            let x = |ms: f64| left + width * ms / max;
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                left - 6.0,
                *y + 12.0,
                xml(&bar.label)
            );
            let _ = writeln!(
                out,
                "<rect x=\"{left}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{}\" fill=\"{color}\"><title>{}: {:.4} ms</title></rect>",
                *y + 2.0,
                (x(bar.median_ms) - left).max(1.0),
                row - 4.0,
                xml(&bar.label),
                bar.median_ms
            );
            if bar.p90_ms > bar.p10_ms {
                let mid = *y + row / 2.0;
                let _ = writeln!(
                    out,
                    "<line x1=\"{:.1}\" y1=\"{mid:.1}\" x2=\"{:.1}\" y2=\"{mid:.1}\" stroke=\"black\"/>",
                    x(bar.p10_ms),
                    x(bar.p90_ms)
                );
            }
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\">{:.4} ms</text>",
                x(bar.p90_ms.max(bar.median_ms)) + 4.0,
                *y + 12.0,
                bar.median_ms
            );
            *y += row;
        }
        *y += 30.0;
    };
    panel(&mut out, "median latency per run (whisker: p10–p90)", variants, "#1f77b4", &mut y);
    if !steps.is_empty() {
        panel(&mut out, "fused program, GPU time per step (top steps)", steps, "#ff7f0e", &mut y);
    }
    let _ = writeln!(out, "</svg>");
    out
}

/// `text` escaped for XML.
fn xml(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(label: &str, median_ms: f64, p10_ms: f64, p90_ms: f64) -> Bar {
        Bar { label: label.into(), median_ms, p10_ms, p90_ms }
    }

    #[test]
    fn latency_plot_scales_bars_to_their_medians() {
        let svg = latency_svg(
            "bert <test>",
            &[bar("unfused", 2.0, 1.9, 2.2), bar("fused", 0.5, 0.49, 0.52)],
            &[bar("attention", 0.1, 0.1, 0.1), bar("gemm+bias", 0.3, 0.3, 0.3)],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("bert &lt;test&gt;"), "titles are escaped");
        // Widths are proportional to the medians within a panel: the longest whisker spans the panel.
        let width = |label: &str| -> f64 {
            let line = svg.lines().find(|l| l.contains(&format!("<title>{label}:"))).unwrap();
            let w = line.split("width=\"").nth(1).unwrap().split('"').next().unwrap();
            w.parse().unwrap()
        };
        assert!((width("unfused") / width("fused") - 4.0).abs() < 0.01);
        assert!((width("gemm+bias") / width("attention") - 3.0).abs() < 0.01);
        assert_eq!(svg.matches("<line").count(), 2, "whiskers only where p10 < p90");
    }
}
