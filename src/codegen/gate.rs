//! The squeeze-and-excitation gate (`Op::ChannelGate`) as one kernel (`templates/gate.cu.hbs`):
//! a block per sample and tile of output channels finishes the pool, computes the first
//! product and its activation in shared memory, and writes its tile of the gate.

use handlebars::Handlebars;
use serde_json::json;

use super::expr::{c_type, header, load, narrow};
use super::kernel::render;
use super::{KernelSource, LaunchScale};
use crate::fusion::Kernel;
use crate::ir::ops::gate::MAX_CHANNELS;
use crate::ir::{Op, SymDim};
use crate::plan::Plan;

/// Threads per block, and output channels per block.
const BLOCK: usize = 256;

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
    if channels > MAX_CHANNELS || units > MAX_CHANNELS {
        return Err(format!("a gate of {channels} channels through {units}: more than {MAX_CHANNELS}"));
    }
    let rows = SymDim::product(&x[1..x.len() - 1]);
    let batch = x[0].clone();
    let tiles = channels.div_ceil(BLOCK);
    let stride = (BLOCK / units).max(1);
    let mut args = Vec::with_capacity(6);
    for &id in inputs.iter().chain([&gate]) {
        args.push(
            *plan.locations.get(&id).ok_or_else(|| format!("'{}' has no memory", graph.node(id).name))?,
        );
    }
    let names = ["x", "w1", "b1", "w2", "b2"];
    let mut params: Vec<String> = names.iter().map(|n| format!("const {t}* __restrict__ {n}")).collect();
    params.push(format!("{t}* __restrict__ out"));
    let scaled = plan.scaled();
    let data = json!({
        "name": name,
        "headers": header(dtype).into_iter().collect::<Vec<_>>(),
        "block": BLOCK,
        "channels": channels,
        "hidden": units,
        "parts": units * stride,
        "stride": stride,
        "tiles": tiles,
        "rows": rows.c(),
        "t": t,
        "params": super::with_limit(plan, params.join(", "), false),
        "load_x": load(&format!("xs[p * {channels}LL + k]"), dtype),
        "load_w1": load(&format!("w1[k * {units} + j]"), dtype),
        "load_b1": load("b1[j]", dtype),
        "load_w2": load(&format!("w2[j * {channels} + c]"), dtype),
        "load_b2": load("b2[c]", dtype),
        "act_hidden": hidden.cuda("a"),
        "store": narrow(&activation.cuda("a"), dtype),
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
