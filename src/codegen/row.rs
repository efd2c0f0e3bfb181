//! Row kernels: a row op (LayerNorm, RMSNorm, softmax, log-softmax, a last-axis reduction)
//! with the pointwise prologue and epilogue the partition gave it.
//!
//! Normalisations and softmax whose rows fit in registers run [`cached`]: a warp per row (a
//! block per row past 1024 elements), each thread reading its elements once — as 16-byte packs
//! where the row is the last axis — into registers, the statistics reduced with warp shuffles,
//! the epilogue computed from the registers. Everything else runs [`general`]: a block per row
//! that recomputes the prologue in every pass.

use handlebars::Handlebars;
use serde_json::json;

use super::expr::literal;
use super::index::{delinearize, reshape_coords, Coords};
use super::kernel::{args, coords_decl, params, render, Body, PackLoad};
use super::KernelSource;
use crate::fusion::Kernel;
use crate::ir::SymDim;
use crate::ir::{DType, NodeId, Op, ReduceOp};
use crate::plan::Plan;

/// Threads of a block-per-row kernel.
const ROW_BLOCK: u32 = 256;
/// Rows a warp-per-row kernel's block holds.
const WARP_ROWS_PER_BLOCK: usize = 4;
/// Fewest lanes a row of the cached kernel takes.
const SUB_WARP_MIN: usize = 8;
/// Most elements a thread of the cached kernel keeps in registers.
const MAX_CACHED: usize = 32;

/// The row op of a kernel and its geometry.
#[derive(Clone)]
struct Row {
    anchor: NodeId,
    /// The anchor's position in the kernel's nodes: prologue before, epilogue after.
    position: usize,
    /// First axis of the row; the row is every axis from it on.
    axis: usize,
    /// Elements per row, at the top of any ranges.
    width: usize,
    /// Rows, at the top of any ranges.
    rows: usize,
    /// Elements per row, and rows, as they follow any ranges.
    width_dims: SymDim,
    rows_dims: SymDim,
}

impl Row {
    fn new(plan: &Plan, kernel: &Kernel) -> Result<Self, String> {
        let graph = &plan.graph;
        let position = kernel
            .nodes
            .iter()
            .position(|&n| {
                matches!(
                    graph.node(n).op,
                    Op::LayerNorm { .. }
                        | Op::RmsNorm { .. }
                        | Op::Softmax { .. }
                        | Op::LogSoftmax { .. }
                        | Op::Reduce { .. }
                )
            })
            .ok_or("a row kernel without a row op")?;
        let anchor = kernel.nodes[position];
        let input = graph.inputs_of(anchor)[0];
        let in_shape = &graph.node(input).ty.shape;
        let axis = match &graph.node(anchor).op {
            Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => *axis,
            _ => in_shape.len().saturating_sub(1),
        };
        let width = in_shape[axis..].iter().product();
        let rows = in_shape[..axis].iter().product();
        let dims = plan.dims(input);
        let (width_dims, rows_dims) = (SymDim::product(&dims[axis..]), SymDim::product(&dims[..axis]));
        Ok(Row { anchor, position, axis, width, rows, width_dims, rows_dims })
    }

    fn split<'k>(&self, kernel: &'k Kernel) -> (&'k [NodeId], &'k [NodeId]) {
        (&kernel.nodes[..self.position], &kernel.nodes[self.position + 1..])
    }
}

pub fn generate(
    plan: &Plan,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    let row = Row::new(plan, kernel)?;
    match cached_layout(plan, kernel, &row) {
        Some(layout) => cached(plan, kernel, &row, layout, name, hb),
        None => general(plan, kernel, &row, name, hb),
    }
}

/// How the cached kernel spreads a row: `threads` per row (a warp, or a block), `pack`
/// consecutive elements per access, `packs` accesses per thread.
#[derive(Clone, Copy)]
struct Layout {
    threads: usize,
    rows_per_block: usize,
    pack: usize,
    packs: usize,
}

/// One statistics pass of a row kernel: `acc` starts at `init`, `body` adds one element,
/// `finish` reduces it over the row into `stat0`/`stat1`.
struct StatPass {
    init: &'static str,
    body: String,
    finish: String,
}

/// How the row's threads combine their partial statistics.
#[derive(Clone, Copy)]
enum Reduction {
    /// Across one warp (shuffles only).
    Warp,
    /// Across this many lanes of a warp, a power of two under 32 (shuffles only): a narrow
    /// row's threads, several rows to a warp.
    Lanes(usize),
    /// Across the block, through 32 floats of `scratch`.
    Block,
}

impl Reduction {
    fn sum(self, acc: &str) -> String {
        match self {
            Reduction::Warp => format!("fusec::warp_sum({acc})"),
            Reduction::Lanes(n) => format!("fusec::lanes_sum<{n}>({acc})"),
            Reduction::Block => format!("fusec::block_sum({acc}, scratch)"),
        }
    }

    fn max(self, acc: &str) -> String {
        match self {
            Reduction::Warp => format!("fusec::warp_max({acc})"),
            Reduction::Lanes(n) => format!("fusec::lanes_max<{n}>({acc})"),
            Reduction::Block => format!("fusec::block_max({acc}, scratch)"),
        }
    }
}

/// `width` as a float C expression: a literal, or the cast of a run-time size.
fn float_size(width: &SymDim) -> String {
    match width.value() {
        Some(w) => format!("{:?}f", w as f64),
        None => format!("(float){}", width.c()),
    }
}

/// The statistics passes of a normalisation or softmax over rows of `width` elements, each
/// element being `x`, and the row op's value from them (before a norm's scale and shift,
/// which [`affine`] adds). `None` for other ops.
fn normalisation(op: &Op, x: &str, width: &SymDim, reduce: Reduction) -> Option<(Vec<StatPass>, String)> {
    let w = float_size(width);
    let epsilon = |e: f32| literal(f64::from(e), DType::F32);
    let pass = |init, body: String, finish: String| StatPass { init, body, finish };
    // A row's mean (`stat0`), then the reciprocal deviation (`stat1`) about it.
    let deviation = |e: f32| {
        vec![
            pass("0.0f", format!("acc += {x};"), format!("stat0 = {} / {w};", reduce.sum("acc"))),
            pass(
                "0.0f",
                format!("const float dev = {x} - stat0; acc += dev * dev;"),
                format!("stat1 = rsqrtf({} / {w} + {});", reduce.sum("acc"), epsilon(e)),
            ),
        ]
    };
    Some(match op {
        Op::LayerNorm { epsilon: e, .. } => (deviation(*e), format!("({x} - stat0) * stat1")),
        // x unchanged, scaled by its reciprocal deviation.
        Op::RmsNorm { epsilon: e, deviation: true, .. } => (deviation(*e), format!("{x} * stat1")),
        Op::RmsNorm { epsilon: e, .. } => (
            vec![pass(
                "0.0f",
                format!("const float e = {x}; acc += e * e;"),
                format!("stat0 = rsqrtf({} / {w} + {});", reduce.sum("acc"), epsilon(*e)),
            )],
            format!("{x} * stat0"),
        ),
        Op::Softmax { .. } | Op::LogSoftmax { .. } => (
            vec![
                pass(
                    "-fusec::inf()",
                    format!("acc = fmaxf(acc, {x});"),
                    format!("stat0 = {};", reduce.max("acc")),
                ),
                pass("0.0f", format!("acc += expf({x} - stat0);"), format!("stat1 = {};", reduce.sum("acc"))),
            ],
            match op {
                Op::Softmax { .. } => format!("expf({x} - stat0) / stat1"),
                _ => format!("{x} - stat0 - logf(stat1)"),
            },
        ),
        _ => return None,
    })
}

/// `y` with a norm's scale (LayerNorm, RMSNorm) and shift (LayerNorm) applied, read at the
/// row element's `coords`.
fn affine(body: &mut Body<'_>, anchor: NodeId, y: String, coords: &Coords) -> Result<String, String> {
    let graph = &body.plan.graph;
    let inputs = graph.inputs_of(anchor);
    let op = graph.node(anchor).op.clone();
    let mut y = y;
    if matches!(op, Op::LayerNorm { .. } | Op::RmsNorm { .. }) {
        if let Some(&g) = inputs.get(1) {
            y = format!("{y} * {}", body.operand(anchor, g, coords)?);
        }
    }
    if matches!(op, Op::LayerNorm { .. }) {
        if let Some(&b) = inputs.get(2) {
            y = format!("{y} + {}", body.operand(anchor, b, coords)?);
        }
    }
    Ok(y)
}

fn cached_layout(plan: &Plan, kernel: &Kernel, row: &Row) -> Option<Layout> {
    let graph = &plan.graph;
    let normalises = matches!(
        graph.node(row.anchor).op,
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. }
    );
    // Registers hold the row op's input only: an epilogue that reads a prologue value needs
    // the prologue recomputed, which the general kernel does.
    let (prologue, epilogue) = row.split(kernel);
    let epilogue_reads_prologue =
        epilogue.iter().any(|&e| graph.inputs_of(e).iter().any(|i| prologue.contains(i)));
    // Rows of a width that follows a range take the general kernel.
    if !normalises || epilogue_reads_prologue || row.width == 0 || !row.width_dims.is_static() {
        return None;
    }
    let rank = graph.node(graph.inputs_of(row.anchor)[0]).ty.shape.len();
    let widest = kernel.outputs.iter().map(|&n| graph.node(n).ty.dtype.size_bytes()).max().unwrap_or(4);
    let pack = match 16 / widest.clamp(1, 16) {
        p if row.axis + 1 == rank && row.width % p == 0 => p,
        _ => 1,
    };
    let (threads, rows_per_block) =
        if row.width <= 1024 { (32, WARP_ROWS_PER_BLOCK) } else { (ROW_BLOCK as usize, 1) };
    // A row of at most 16 accesses (ConvNeXt's 96 channels in packs of 8) takes the lanes it
    // needs, several rows to a warp, where every warp's rows are all there (no lane returns
    // before the shuffles).
    let lanes = row.width.div_ceil(pack).next_power_of_two().max(SUB_WARP_MIN);
    let rows_per_warp = 32 / lanes;
    let (threads, rows_per_block) = if threads == 32
        && lanes < 32
        && !plan.scaled()
        && row.rows % (WARP_ROWS_PER_BLOCK * rows_per_warp) == 0
    {
        (lanes, WARP_ROWS_PER_BLOCK * rows_per_warp)
    } else {
        (threads, rows_per_block)
    };
    let packs = row.width.div_ceil(threads * pack);
    (packs * pack <= MAX_CACHED).then_some(Layout { threads, rows_per_block, pack, packs })
}

/// Registers a thread may spend on the epilogue's operands loaded before the statistics.
const EARLY_WORDS: usize = 32;

/// The epilogue's pack loads of a cached row kernel, issued before the statistics are reduced
/// (the LayerNorm's weight and bias, a residual read after it) so that their latency passes
/// under the shuffles rather than after them: one array of packs a load, filled in a loop of
/// its own.
#[derive(Default)]
struct Early {
    /// The arrays' declarations.
    decls: Vec<String>,
    /// One element of each array, at pack `k` (the loop's index).
    loads: Vec<String>,
}

/// Splits the epilogue's statements before its lane loop (its vector `loads`, store
/// registers) into the loads moved early and what stays, each moved load read there from its
/// array. Nothing moves where the arrays would take more than [`EARLY_WORDS`] registers.
fn early_loads(before: Vec<String>, loads: &[PackLoad], packs: usize) -> (Early, Vec<String>) {
    let words: usize = loads.iter().map(|l| l.words() * packs).sum();
    if words == 0 || words > EARLY_WORDS {
        return (Early::default(), before);
    }
    let early = Early {
        decls: loads.iter().map(|l| format!("{} {}_early[{packs}];", l.c_type(), l.name)).collect(),
        loads: loads.iter().map(|l| format!("{}_early[k] = {};", l.name, l.value)).collect(),
    };
    let kept = before
        .into_iter()
        .map(|statement| match loads.iter().find(|l| l.declaration() == statement) {
            Some(l) => format!("const {} {} = {}_early[k];", l.c_type(), l.name, l.name),
            None => statement,
        })
        .collect();
    (early, kept)
}

/// The register-cached row kernel (see the module's documentation).
fn cached(
    plan: &Plan,
    kernel: &Kernel,
    row: &Row,
    layout: Layout,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    let graph = &plan.graph;
    let node = graph.node(row.anchor);
    let inputs = graph.inputs_of(row.anchor);
    let in_shape = plan.dims(inputs[0]);
    let rank = in_shape.len();
    let (prologue_nodes, epilogue_nodes) = row.split(kernel);
    let mut body = Body::new(plan, kernel);
    // Along the last axis the element's coordinate is `cj`; a row over several axes
    // delinearises each element's index.
    let last_axis = row.axis + 1 == rank;
    let element = format!("(row * {}LL + cj)", row.width);
    let (row_coords, element_coords, coords) = if last_axis {
        let (decls, mut names) = coords_decl("c", "row", &in_shape[..rank - 1]);
        names.push("cj".into());
        let mut base = names.clone();
        base[rank - 1] = "cb".into();
        body.know(&base, &in_shape, &format!("(row * {}LL + cb)", row.width));
        (decls, Vec::new(), names)
    } else {
        let (decls, names) = coords_decl("c", &element, &in_shape);
        (Vec::new(), decls, names)
    };
    body.know(&coords, &in_shape, &element);
    let in_prologue = |n: &NodeId| prologue_nodes.contains(n);
    // Pass 0: the prologue, once; its outputs other kernels read; the row op's input kept.
    if layout.pack > 1 {
        body.begin_lanes(layout.pack, SymDim::lit(row.width), "cb");
    }
    for &p in prologue_nodes {
        body.compute(p, &coords)?;
    }
    let x = body.value_at(inputs[0], coords.clone())?;
    body.statements.push(format!("xr[k * {} + j] = {x};", layout.pack));
    for &o in kernel.outputs.iter().filter(|o| in_prologue(o)) {
        body.store(kernel, o, &coords)?;
    }
    let load = std::mem::take(&mut body.statements);
    let (load_before, load_after) = body.end_lanes();
    // The statistics, from registers.
    let reduce = match layout.threads {
        32 => Reduction::Warp,
        n if n < 32 => Reduction::Lanes(n),
        _ => Reduction::Block,
    };
    let (stats, y) = normalisation(&node.op, "x", &row.width_dims, reduce)
        .ok_or_else(|| format!("no cached row code for {}", node.op.kind()))?;
    let passes: Vec<serde_json::Value> =
        stats.iter().map(|p| json!({ "init": p.init, "body": p.body, "finish": p.finish })).collect();
    // The last pass: the row op's value, the epilogue, the stores.
    if layout.pack > 1 {
        body.begin_lanes(layout.pack, SymDim::lit(row.width), "cb");
    }
    let y = affine(&mut body, row.anchor, y, &coords)?;
    body.statements.push(format!("const float v{} = {y};", row.anchor.index()));
    // An epilogue node behind a reshape has the row's elements in another shape.
    let coords_of = |n: NodeId| reshape_coords(&coords, &in_shape, &plan.dims(n));
    for &e in epilogue_nodes {
        body.compute(e, &coords_of(e))?;
    }
    for &o in kernel.outputs.iter().filter(|o| !in_prologue(o)) {
        body.store(kernel, o, &coords_of(o))?;
    }
    let finish = std::mem::take(&mut body.statements);
    let (finish_before, finish_after, finish_loads) = body.end_lanes_with_loads();
    let (early, finish_before) = if crate::knobs::off("FUSEC_ROW_EARLY") {
        (Early::default(), finish_before)
    } else {
        early_loads(finish_before, &finish_loads, layout.packs)
    };
    let threads = layout.threads * layout.rows_per_block;
    let data = json!({
        "name": name,
        "headers": body.headers.iter().collect::<Vec<_>>(),
        "about": kernel.kind.name(),
        "block": threads,
        "warp_rows": layout.threads <= 32,
        "rows_per_block": layout.rows_per_block,
        "limit": super::limit(row.rows, plan.scaled()),
        "threads_per_row": layout.threads,
        "pack": layout.pack,
        "packs": layout.packs,
        "width": row.width,
        "params": super::with_limit(plan, params(&body), true),
        "row_coords": row_coords,
        "element_coords": element_coords,
        "load_before": load_before,
        "load": load,
        "load_after": load_after,
        "passes": passes,
        "early_decls": early.decls,
        "early_loads": early.loads,
        "finish_before": finish_before,
        "finish": finish,
        "finish_after": finish_after,
    });
    let mut source = KernelSource::new(
        name,
        render(hb, "row_cached", &data)?,
        u32::try_from(row.rows.div_ceil(layout.rows_per_block).max(1)).map_err(|_| "row grid too large")?,
        threads as u32,
        args(&body),
    );
    if plan.scaled() {
        source.scale =
            Some(super::LaunchScale::new(row.rows_dims.clone(), layout.rows_per_block as u64, true));
    }
    Ok(source)
}

/// Block per row, the prologue recomputed in every pass: any row op (also reductions), any
/// width, epilogues that read prologue values.
fn general(
    plan: &Plan,
    kernel: &Kernel,
    row: &Row,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    let graph = &plan.graph;
    let (anchor, rows) = (row.anchor, row.rows);
    let width = &row.width_dims;
    let node = graph.node(anchor);
    let inputs = graph.inputs_of(anchor);
    let in_shape = plan.dims(inputs[0]);
    let (prologue_nodes, epilogue_nodes) = row.split(kernel);
    let mut body = Body::new(plan, kernel);
    let (coord_decls, coords) = coords_decl("c", "i", &in_shape);
    body.know(&coords, &in_shape, "i");
    for &p in prologue_nodes {
        body.compute(p, &coords)?;
    }
    let prologue = std::mem::take(&mut body.statements);
    let x = body.value_at(inputs[0], coords.clone())?;
    let w = float_size(width);
    let v = format!("v{}", anchor.index());
    let mut passes: Vec<serde_json::Value> = Vec::new();
    let mut pass = |init: &str, body_lines: Vec<String>, finish: Vec<String>| {
        passes.push(json!({ "init": init, "body": body_lines, "finish": finish }));
    };
    // The last pass computes v<anchor> per element, then the epilogue and the stores.
    let mut last_body: Vec<String> = Vec::new();
    let reduce_row = matches!(node.op, Op::Reduce { .. });
    match &node.op {
        op @ (Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. }) => {
            let (stats, y) = normalisation(op, &x, width, Reduction::Block)
                .ok_or_else(|| format!("no row code for {}", op.kind()))?;
            for p in stats {
                pass(p.init, vec![p.body], vec![p.finish]);
            }
            let y = affine(&mut body, anchor, y, &coords)?;
            last_body.push(format!("const float {v} = {y};"));
        }
        Op::Reduce { op, .. } => {
            let (init, step, finish) = match op {
                ReduceOp::Max => (
                    "-fusec::inf()",
                    format!("acc = fmaxf(acc, {x});"),
                    "fusec::block_max(acc, scratch)".to_string(),
                ),
                ReduceOp::Sum => {
                    ("0.0f", format!("acc += {x};"), "fusec::block_sum(acc, scratch)".to_string())
                }
                ReduceOp::Mean => {
                    ("0.0f", format!("acc += {x};"), format!("(fusec::block_sum(acc, scratch) / {w})"))
                }
            };
            body.statements.clear();
            let out_shape = plan.dims(anchor);
            let out_coords = delinearize("row", &out_shape);
            body.know(&out_coords, &out_shape, "row");
            // An epilogue node behind a reshape has the row's result in another shape.
            let coords_of = |n: NodeId| reshape_coords(&out_coords, &out_shape, &plan.dims(n));
            let mut finish_lines =
                vec![format!("const float {v} = {finish};"), "if (threadIdx.x == 0) {".to_string()];
            for &e in epilogue_nodes {
                body.compute(e, &coords_of(e))?;
            }
            for &o in &kernel.outputs {
                if !prologue_nodes.contains(&o) {
                    body.store(kernel, o, &coords_of(o))?;
                }
            }
            finish_lines.append(&mut body.statements);
            finish_lines.push("}".into());
            // Prologue values other kernels need are written in the same pass.
            let mut stores = Vec::new();
            for &o in &kernel.outputs {
                if prologue_nodes.contains(&o) {
                    body.store(kernel, o, &coords)?;
                }
            }
            stores.append(&mut body.statements);
            let mut lines = vec![step];
            lines.extend(stores);
            pass(init, lines, finish_lines);
        }
        other => return Err(format!("no row code for {}", other.kind())),
    }
    if !reduce_row {
        body.statements.clear();
        // An epilogue node behind a reshape has the row's elements in another shape.
        let coords_of = |n: NodeId| reshape_coords(&coords, &in_shape, &plan.dims(n));
        for &e in epilogue_nodes {
            body.compute(e, &coords_of(e))?;
        }
        for &o in &kernel.outputs {
            body.store(kernel, o, &coords_of(o))?;
        }
        last_body.append(&mut body.statements);
        pass("0.0f", last_body, vec![]);
    }
    let data = json!({
        "name": name,
        "headers": body.headers.iter().collect::<Vec<_>>(),
        "about": kernel.kind.name(),
        "block": ROW_BLOCK,
        "width": width.c(),
        "width_text": width.value().map_or_else(|| width.c(), |w| w.to_string()),
        "params": super::with_limit(plan, params(&body), false),
        "coords": coord_decls,
        "prologue": prologue,
        "passes": passes,
    });
    let mut source =
        KernelSource::new(name, render(hb, "row", &data)?, rows.max(1) as u32, ROW_BLOCK, args(&body));
    if plan.scaled() {
        source.scale = Some(super::LaunchScale::new(row.rows_dims.clone(), 1, false));
    }
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::early_loads;
    use crate::codegen::kernel::PackLoad;
    use crate::ir::DType;

    #[test]
    fn epilogue_loads_move_before_the_statistics_within_a_register_budget() {
        let pack = |name: &str, value: &str| PackLoad {
            dtype: DType::F16,
            count: 8,
            name: name.into(),
            value: value.into(),
        };
        let weight = pack("p3", "*reinterpret_cast<const fusec::Pack<__half, 8>*>(in2 + (cb))");
        let bias = pack(
            "p4",
            "fusec::load_or_zero(reinterpret_cast<const fusec::Pack<__half, 8>*>(in3 + (cb)), c0 < 3)",
        );
        assert_eq!(
            weight.declaration(),
            "const fusec::Pack<__half, 8> p3 = *reinterpret_cast<const fusec::Pack<__half, 8>*>(in2 + (cb));"
        );
        let store = "fusec::Pack<__half, 8> s1;";
        let loads = [weight.clone(), bias.clone()];
        let before = vec![weight.declaration(), store.to_string(), bias.declaration()];
        let (early, kept) = early_loads(before.clone(), &loads, 3);
        assert_eq!(
            early.decls,
            ["fusec::Pack<__half, 8> p3_early[3];", "fusec::Pack<__half, 8> p4_early[3];"]
        );
        assert_eq!(
            early.loads[1],
            "p4_early[k] = fusec::load_or_zero(reinterpret_cast<const fusec::Pack<__half, 8>*>(in3 + (cb)), c0 < 3);"
        );
        assert_eq!(
            kept,
            [
                "const fusec::Pack<__half, 8> p3 = p3_early[k];",
                store,
                "const fusec::Pack<__half, 8> p4 = p4_early[k];"
            ]
        );
        // Two loads of 4 words over 5 packs would take 40 registers: nothing moves.
        let (early, kept) = early_loads(before.clone(), &loads, 5);
        assert!(early.decls.is_empty() && early.loads.is_empty());
        assert_eq!(kept, before);
        // Only store registers: nothing to move.
        let (early, kept) = early_loads(vec![store.to_string()], &[], 1);
        assert!(early.loads.is_empty() && kept == [store]);
    }

    #[test]
    fn pack_sizes_follow_their_element_types() {
        let pack = |dtype, count| PackLoad { dtype, count, name: "p".into(), value: "v".into() };
        assert_eq!(pack(DType::F16, 8).words(), 4);
        assert_eq!(pack(DType::BF16, 4).words(), 2);
        assert_eq!(pack(DType::F32, 4).words(), 4);
        assert_eq!(pack(DType::I64, 2).words(), 4);
        assert_eq!(pack(DType::BF16, 4).c_type(), "fusec::Pack<__nv_bfloat16, 4>");
    }
}
