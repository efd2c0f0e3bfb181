//! The squeeze-and-excitation gate (`Op::ChannelGate`) as one kernel (`templates/gate.cu.hbs`):
//! a block per sample and tile of output channels finishes the pool, computes the first
//! product and its activation in shared memory, and writes its tile of the gate.

use handlebars::Handlebars;
use serde_json::json;

use super::expr::{c_type, header, load, narrow};
use super::kernel::render;
use super::{KernelSource, LaunchScale};
use crate::fusion::Kernel;
use crate::ir::ops::gate::MAX_WIDTH;
use crate::ir::{Op, SymDim};
use crate::plan::Plan;

/// Threads per block.
const BLOCK: usize = 512;

/// Output channels per block.
const TILE: usize = 256;

/// Consecutive elements of `width` a thread reads as one pack (16 bytes at most).
fn lanes(width: usize, element: usize) -> usize {
    [8, 4, 2, 1].into_iter().find(|&v| v * element <= 16 && width % v == 0).unwrap_or(1)
}

pub fn generate(
    plan: &Plan,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    let graph = &plan.graph;
    let gate = *kernel.nodes.last().ok_or("an empty kernel")?;
    let Op::ChannelGate { hidden, gate: activation } = graph.node(gate).op else {
        return Err("a gate kernel without a ChannelGate".into());
    };
    if kernel.nodes.len() != 1 || kernel.outputs != [gate] {
        return Err("a gate kernel computes its gate alone".into());
    }
    let inputs = graph.inputs_of(gate);
    let dtype = graph.node(gate).ty.dtype;
    let t = c_type(dtype)?;
    let x = plan.dims(inputs[0]);
    let channels = x.last().and_then(SymDim::value).ok_or("a gate over a range of channels")?;
    let units = graph.node(inputs[1]).ty.shape[1];
    if channels + units > MAX_WIDTH {
        return Err(format!("a gate of {channels} channels through {units}: more than {MAX_WIDTH}"));
    }
    let rows = SymDim::product(&x[1..x.len() - 1]);
    let batch = x[0].clone();
    let tiles = channels.div_ceil(TILE);
    let element = dtype.size_bytes();
    let (lanes1, lanes2) = (lanes(units, element), lanes(channels, element));
    let (groups1, groups2) = (units / lanes1, TILE / lanes2);
    let (splits1, splits2) = ((BLOCK / groups1).max(1), (BLOCK / groups2).max(1));
    let mut args = Vec::with_capacity(7);
    for &id in inputs.iter().chain([&gate]) {
        args.push(
            *plan.locations.get(&id).ok_or_else(|| format!("'{}' has no memory", graph.node(id).name))?,
        );
    }
    // The projection's width, where the gate is folded into its weights.
    let project = inputs.get(5).map(|&wp| graph.node(wp).ty.shape[1]);
    let names = ["x", "w1", "b1", "w2", "b2", "wp"];
    let mut params: Vec<String> =
        names[..inputs.len()].iter().map(|n| format!("const {t}* __restrict__ {n}")).collect();
    params.push(format!("{t}* __restrict__ out"));
    let scaled = plan.scaled();
    let data = json!({
        "name": name,
        "headers": header(dtype).into_iter().collect::<Vec<_>>(),
        "block": BLOCK,
        "tile": TILE,
        "channels": channels,
        "hidden": units,
        "parts": (splits1 * units).max(splits2 * TILE),
        "lanes1": lanes1,
        "lanes2": lanes2,
        "groups1": groups1,
        "groups2": groups2,
        "splits1": splits1,
        "splits2": splits2,
        "tiles": tiles,
        "rows": rows.c(),
        "t": t,
        "params": super::with_limit(plan, params.join(", "), false),
        "load_x": load(&format!("xs[p * {channels}LL + k]"), dtype),
        "load_w1": load("w.v[v]", dtype),
        "load_b1": load("b1[j]", dtype),
        "load_w2": load("w.v[v]", dtype),
        "load_b2": load("b2[c]", dtype),
        "act_hidden": hidden.cuda("a"),
        "activation": activation.cuda("a"),
        "store": narrow("a", dtype),
        "project": project.is_some(),
        "outputs": project.unwrap_or(1),
        "load_wp": load(&format!("wp[row * {}LL + e % {}]", project.unwrap_or(1), project.unwrap_or(1)), dtype),
    });
    let grid = batch.value().unwrap_or_else(|| graph.node(gate).ty.shape[0]) * tiles;
    let mut source =
        KernelSource::new(name, render(hb, "gate", &data)?, grid.max(1) as u32, BLOCK as u32, args);
    if scaled {
        source.scale =
            Some(LaunchScale { units: batch, per_block: 1, times: SymDim::lit(tiles), bound: false });
    }
    Ok(source)
}
