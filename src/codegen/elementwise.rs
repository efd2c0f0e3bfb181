//! Elementwise kernels: one thread per element of the kernel's last node (several
//! consecutive elements where the last axis splits into 16-byte packs), and the choice of
//! template for every generated kernel.

use handlebars::Handlebars;
use serde_json::json;

use super::index::{delinearize, trace_back, Coords, Dims};
use super::kernel::{args, coords_decl, params, render, Body, GemmRaw, BLOCK, LANE, TILE_FIRST, TILE_OFFSET};
use super::KernelSource;
use crate::fusion::{Kernel, KernelKind};
use crate::ir::{NodeId, Op, SymDim};
use crate::plan::Plan;

pub fn generate(
    plan: &Plan,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    match kernel.kind {
        KernelKind::RowReduction { .. } => super::row::generate(plan, kernel, name, hb),
        KernelKind::Attention => super::attention::generate(plan, kernel, name, hb),
        _ => elementwise(plan, kernel, name, hb, None),
    }
}

/// One thread per element of the kernel's last node; every node of the kernel has its shape.
pub fn elementwise(
    plan: &Plan,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
    gemm: Option<GemmRaw>,
) -> Result<KernelSource, String> {
    let graph = &plan.graph;
    let mut body = Body::new(plan, kernel);
    body.gemm = gemm;
    let computed: Vec<NodeId> = kernel.nodes.iter().copied().filter(|&n| body.computes(n)).collect();
    let last = *kernel.nodes.last().ok_or("an empty kernel")?;
    // Caches appended to in place (`passes::CacheInPlace`; appends of one geometry share a
    // kernel): one thread per element of the new part, each stored after the part already
    // there.
    let appends: Vec<(NodeId, usize, Vec<NodeId>)> = kernel
        .nodes
        .iter()
        .filter_map(|&n| match graph.node(n).op {
            Op::Append { axis } => Some((n, axis, graph.inputs_of(n))),
            _ => None,
        })
        .collect();
    let append_of = |n: NodeId| appends.iter().find(|(a, _, _)| *a == n);
    // A pointwise kernel whose one output is stored through a transposing view runs over
    // that view's layout (`stored_layout`).
    let relayout = if appends.is_empty() && gemm.is_none() {
        stored_layout(plan, kernel, last, &computed)
    } else {
        None
    };
    let domain = relayout.or(appends.first().map(|(_, _, inputs)| inputs[1])).unwrap_or(last);
    if appends.iter().any(|(_, _, inputs)| plan.dims(inputs[1]) != plan.dims(domain)) {
        return Err("appends of different shapes in one kernel".into());
    }
    let shape = plan.dims(domain);
    let count = graph.node(domain).ty.len();
    if let Some(tile) = super::depthwise::tile(plan, kernel, &shape).filter(|_| gemm.is_none()) {
        if let Some(source) = super::depthwise::generate(plan, kernel, name, hb, tile)? {
            return Ok(source);
        }
    }
    let lanes = lane_count(plan, kernel, gemm.is_some(), &shape);
    let tile = if lanes > 1 && gemm.is_none() { depthwise_tile(plan, kernel, &shape) } else { None };
    let (coord_decls, mut coords) = match tile {
        Some(columns) => tile_decls(&shape, columns)?,
        None => coords_decl("c", "i", &shape),
    };
    body.know(&coords, &shape, "i");
    let mut linear = "i".to_string();
    let mut base = String::new();
    if lanes > 1 {
        base = coords.pop().ok_or("lanes over no axis")?;
        coords.push(LANE.into());
        linear = "(i + j)".into();
        body.begin_lanes(lanes, shape.last().cloned().ok_or("lanes over no axis")?, &base);
        body.know(&coords, &shape, &linear);
        if let Some(columns) = tile {
            body.begin_tile(columns);
        }
    }
    // In a kernel over its stored layout, every node's element is the one the view's element
    // traces back to.
    let traced = match relayout {
        Some(view) => Some(
            trace_back(graph, &|n| plan.dims(n), view, coords.clone(), &|n| n == last)
                .ok_or("a stored layout that does not trace back to its value")?
                .1,
        ),
        None => None,
    };
    // Nodes of another shape with as many elements (behind a reshape) share the linear index.
    let coords_of = |n: NodeId| {
        let s = plan.dims(n);
        if let Some(traced) = &traced {
            traced.clone()
        } else if let Some((_, axis, inputs)) = append_of(n) {
            let mut at = coords.clone();
            at[*axis] = format!("({} + {})", at[*axis], plan.dims(inputs[0])[*axis].c());
            at
        } else if s == shape {
            coords.clone()
        } else if s.iter().chain(&shape).all(SymDim::is_static) {
            delinearize(&linear, &s)
        } else {
            super::index::reshape_coords(&coords, &shape, &s)
        }
    };
    for &n in &computed {
        if graph.node(n).ty.len() != count && append_of(n).is_none() {
            return Err(format!(
                "'{}' is {} in a kernel over {:?}",
                graph.node(n).name,
                graph.node(n).ty,
                graph.node(last).ty.shape
            ));
        }
        let at = if append_of(n).is_some() { coords.clone() } else { coords_of(n) };
        body.compute(n, &at)?;
    }
    for &o in &kernel.outputs {
        match relayout {
            Some(view) => body.store_in_layout(o, view, &coords)?,
            None => body.store(kernel, o, &coords_of(o))?,
        }
    }
    let prologue = body.prologue();
    let (before, after) = body.end_lanes();
    let threads = match tile {
        Some(columns) => tiled(&shape, columns)?.iter().filter_map(SymDim::value).product::<usize>() / lanes,
        None => count / lanes,
    };
    let units = SymDim::product(&shape).div_exact(lanes).ok_or("lanes that do not divide the kernel")?;
    let scaled = plan.scaled();
    let data = json!({
        "name": name,
        "headers": body.headers.iter().collect::<Vec<_>>(),
        "about": kernel.kind.name(),
        "block": BLOCK,
        "limit": super::limit(threads, scaled),
        "lanes": lanes,
        "vector": lanes > 1,
        "lane": LANE,
        "base": base,
        "params": super::with_limit(plan, params(&body), true),
        "coords": coord_decls,
        "prologue": prologue,
        "tile": tile,
        "tile_offset": TILE_OFFSET,
        "tile_first": TILE_FIRST,
        "columns": shape.get(2).map(SymDim::c),
        "before": before,
        "statements": body.statements,
        "after": after,
    });
    let mut source = KernelSource::new(
        name,
        render(hb, "elementwise", &data)?,
        threads.div_ceil(BLOCK as usize).max(1) as u32,
        BLOCK,
        args(&body),
    );
    if scaled {
        source.scale = Some(super::LaunchScale::new(units, u64::from(BLOCK), true));
    }
    Ok(source)
}

/// How many consecutive elements of the last axis each thread of an elementwise kernel
/// computes: enough for 16-byte stores of its widest output type, when the last axis
/// splits evenly (buffers start 256-byte aligned, so every such access is aligned); 1 for
/// kinds whose per-element work is a loop.
fn lane_count(plan: &Plan, kernel: &Kernel, gemm_epilogue: bool, shape: &Dims) -> usize {
    let graph = &plan.graph;
    // A depthwise convolution in NHWC reads a pack of channels per tap (`depthwise_packs`).
    let depthwise = kernel.kind == KernelKind::Conv
        && kernel.nodes.first().is_some_and(|&c| {
            graph.is_depthwise_conv(c)
                && matches!(graph.node(c).op, crate::ir::Op::Conv { channels_last: true, .. })
        });
    // A concatenation's parts load their packs only where they are read (`Body::guarded`).
    let concat = matches!(kernel.kind, KernelKind::Single { .. })
        && kernel.nodes.iter().all(|&n| matches!(graph.node(n).op, crate::ir::Op::Concat { .. }));
    let kind_fits = gemm_epilogue
        || depthwise
        || concat
        || matches!(kernel.kind, KernelKind::Pointwise | KernelKind::Gather | KernelKind::Copy);
    // Packs of wider inputs span several 16-byte accesses, still aligned: a pack's first
    // element is a multiple of `lanes` into a 256-byte-aligned buffer.
    let widest = kernel.outputs.iter().map(|&n| graph.node(n).ty.dtype.size_bytes()).max().unwrap_or(16);
    let lanes = 16 / widest.clamp(1, 16);
    match shape.last() {
        Some(width) if kind_fits && lanes > 1 && width.divisible_by(lanes) => lanes,
        _ => 1,
    }
}

/// Columns per thread of a depthwise convolution kernel in NHWC (each input row loaded once
/// for all of them, `Body::depthwise_packs`): where every value of the kernel has the
/// convolution's static shape and the width is over one column.
fn depthwise_tile(plan: &Plan, kernel: &Kernel, shape: &Dims) -> Option<usize> {
    const COLUMNS: usize = 4;
    let graph = &plan.graph;
    let conv = *kernel.nodes.first()?;
    let nhwc = matches!(graph.node(conv).op, crate::ir::Op::Conv { channels_last: true, .. });
    let same = kernel.nodes.iter().all(|&n| plan.dims(n) == *shape);
    let width = shape.get(2)?.value()?;
    let fits = shape.len() == 4 && shape.iter().all(SymDim::is_static) && width > 1;
    (kernel.kind == KernelKind::Conv && nhwc && graph.is_depthwise_conv(conv) && same && fits)
        .then_some(COLUMNS.min(width))
}

/// `shape` with its width (axis 2) counted in tiles of `columns`: the threads of a tiled
/// kernel, times its lanes.
fn tiled(shape: &Dims, columns: usize) -> Result<Vec<SymDim>, String> {
    let mut tiled = shape.to_vec();
    let width = shape.get(2).and_then(SymDim::value).ok_or("a tile over a range")?;
    tiled[2] = SymDim::lit(width.div_ceil(columns));
    Ok(tiled)
}

/// Coordinates of a tiled thread: n, p and the channel from the thread's index over
/// `[N, P, tiles, C]`, and its tile's first column (the column itself is declared in the loop
/// over the tile).
fn tile_decls(shape: &Dims, columns: usize) -> Result<(Vec<String>, Coords), String> {
    let exprs = delinearize("i", &tiled(shape, columns)?);
    let names: Coords = (0..shape.len()).map(|d| format!("c{d}")).collect();
    let decls = names
        .iter()
        .zip(&exprs)
        .enumerate()
        .map(|(d, (n, e))| match d {
            2 => format!("const long long {TILE_FIRST} = {columns}LL * {e};"),
            _ => format!("const long long {n} = {e};"),
        })
        .collect();
    Ok((decls, names))
}

/// The view a pointwise kernel stores its one output through, where the kernel is better run
/// over that view's layout than over its own: the view transposes so that the value's lanes
/// are not consecutive there (its stores would be scattered elements, not packs), while the
/// view's first four elements are four consecutive elements of the value (so the reads,
/// gathered, still come in runs) — an image cast into the 4×4 patches a GEMM reads. Static
/// shapes, every node of the value's shape.
fn stored_layout(plan: &Plan, kernel: &Kernel, last: NodeId, computed: &[NodeId]) -> Option<NodeId> {
    let graph = &plan.graph;
    if kernel.kind != KernelKind::Pointwise || kernel.outputs != [last] {
        return None;
    }
    let &(_, view) = kernel.store_views.iter().find(|(v, _)| *v == last)?;
    let shape = plan.sizes(last)?;
    if plan.sizes(view)?.last().is_none_or(|&w| w % 4 != 0)
        || computed.iter().any(|&n| plan.sizes(n).as_ref() != Some(&shape))
    {
        return None;
    }
    let lanes = 16 / graph.node(last).ty.dtype.size_bytes().clamp(1, 16);
    if super::index::stores_pack_along(graph, &|n| plan.dims(n), last, view, lanes) {
        return None;
    }
    let first = traced_index(plan, last, view, 0)?;
    (1..4).all(|e| traced_index(plan, last, view, e) == Some(first + e)).then_some(view)
}

/// The linear index in `value` of element `e` of `view`, a chain of reshapes and transposes of
/// it (static shapes).
fn traced_index(plan: &Plan, value: NodeId, view: NodeId, e: usize) -> Option<usize> {
    let graph = &plan.graph;
    let unravel = |mut at: usize, shape: &[usize]| {
        let mut coords = vec![0; shape.len()];
        for (c, &d) in coords.iter_mut().zip(shape).rev() {
            (*c, at) = (at % d.max(1), at / d.max(1));
        }
        coords
    };
    let ravel =
        |coords: &[usize], shape: &[usize]| coords.iter().zip(shape).fold(0, |acc, (&c, &d)| acc * d + c);
    let (mut id, mut coords) = (view, unravel(e, &plan.sizes(view)?));
    while id != value {
        let input = *graph.inputs_of(id).first()?;
        coords = match &graph.node(id).op {
            Op::Reshape { .. } | Op::Identity | Op::Dropout => {
                unravel(ravel(&coords, &plan.sizes(id)?), &plan.sizes(input)?)
            }
            Op::Transpose { perm } => {
                let mut inner = vec![0; perm.len()];
                for (o, &p) in perm.iter().enumerate() {
                    inner[p] = coords[o];
                }
                inner
            }
            _ => return None,
        };
        id = input;
    }
    Some(ravel(&coords, &plan.sizes(value)?))
}
