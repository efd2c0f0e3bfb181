//! Attention of a decoding step: one query row a batch × head, keys over a cache
//! (`templates/attention_decode.cu.hbs`). The tensor-core kernel computes 16 query rows a warp
//! and stages key tiles through shared memory; for one row that is a chain of copies, barriers
//! and products of which a sixteenth counts. Here each key is read straight into the registers
//! of a group of lanes, 16 bytes a lane, the keys that weigh anything (found from the mask
//! first) split evenly over the blocks of a cluster and their lanes.

use serde_json::json;

use super::{forced_cluster, half_names, outproj, qkv, rows, Common, Problem, MULTIPROCESSORS};
use crate::codegen::expr::header;
use crate::codegen::index::trace_back;
use crate::codegen::kernel::{coords_decl, Body};
use crate::codegen::KernelSource;
use crate::fusion::Kernel;
use crate::ir::{DType, Op, SymDim};
use crate::knobs;
use crate::plan::Plan;

/// Threads a block.
const THREADS: usize = 128;
/// Threads a block where the kernel computes its Q, K and V projection (`qkv`): its share of
/// the projection's weights and sums over more warps (GPT-2 small at batch 1 on an H200:
/// 0.195 ms a token against 0.205 at 128 threads, `benches/NOTES.md`, forty-fourth session).
const THREADS_PROJECTING: usize = 256;
/// Keys a lane group has in flight at once.
const UNROLL: usize = 4;

/// Threads a block and keys a lane group a trip: [`THREADS`] (or [`THREADS_PROJECTING`] where
/// the kernel `projects`) and [`UNROLL`] unless `FUSEC_ATTENTION_DECODE_THREADS` (64, 128, 256
/// or 512) or `FUSEC_ATTENTION_DECODE_UNROLL` (1, 2, 4 or 8) says otherwise, for measuring them.
fn launch(projects: bool) -> (usize, usize) {
    let threads = if projects { THREADS_PROJECTING } else { THREADS };
    (
        knobs::one_of("FUSEC_ATTENTION_DECODE_THREADS", &[64, 128, 256, 512]).unwrap_or(threads),
        knobs::one_of("FUSEC_ATTENTION_DECODE_UNROLL", &[1, 2, 4, 8]).unwrap_or(UNROLL),
    )
}

/// The decoding kernel for `problem`, where it applies: half types, one query row (at the top
/// of any ranges, and fixed), the depth and the value width multiples of 8 of at most 256,
/// and K and V rows contiguous in 16-byte runs. `FUSEC_ATTENTION_DECODE=0` turns it off, for
/// measuring it against the tensor-core kernel.
pub(super) fn generate(
    plan: &Plan,
    kernel: &Kernel,
    problem: &Problem,
    name: &str,
    hb: &handlebars::Handlebars<'_>,
) -> Result<Option<KernelSource>, String> {
    let dtype = plan.graph.node(problem.anchor).ty.dtype;
    let rank = problem.rank();
    let one_query = problem.out_dims[rank - 2].value() == Some(1);
    let (depth, dv) = (problem.depth, problem.dv());
    let fits = depth % 8 == 0 && dv % 8 == 0 && depth.max(dv) <= 256;
    let off = knobs::off("FUSEC_ATTENTION_DECODE");
    if !matches!(dtype, DType::F16 | DType::BF16) || !one_query || !fits || off {
        return Ok(None);
    }
    let mut body = Body::new(plan, kernel);
    body.headers.extend(header(dtype));
    // Appends to the cache that joined this kernel (`fusion::decoding_takes_appends`): their
    // buffers are read as stored values, through the pointer the new position is stored with.
    for &n in &kernel.nodes {
        if matches!(plan.graph.node(n).op, Op::Append { .. }) {
            body.members.remove(&n);
            body.read_back.insert(n);
        }
    }
    let (coord_decls, batch) = coords_decl("c", "bh", &problem.out_dims[..rank - 2]);
    let mut operands = problem.operands(&mut body, kernel, &batch)?;
    let mut append = match body.read_back.is_empty() {
        true => None,
        false => Some(appended(plan, &mut body, problem, &batch)?),
    };
    let k_address = problem.packed_address(&mut body, 1, &batch, ["d", "t"], 2, 8, dtype)?;
    let v_address = problem.packed_address(&mut body, 2, &batch, ["t", "e"], 1, 8, dtype)?;
    let (Some(k_address), Some(v_address)) = (k_address, v_address) else { return Ok(None) };
    let group = problem.lanes_a_key();
    let mut cluster = cluster_size(problem.heads());
    let scan = problem.inputs.len() > 3 && operands.causal.is_none();
    // A batch of sequences whose projection this kernel may compute (`rows`), in clusters of
    // its own.
    let rows = rows::batch(problem, scan);
    // The Q, K and V projection computed here where it can be: q and the new key and value
    // then come from the kernel's shared memory.
    let projection = match &mut append {
        Some(append) => {
            let q_pack = problem.packed_address(&mut body, 0, &batch, ["s", "d"], 1, 8, dtype)?;
            let packs = [q_pack.as_deref(), append["k_pack"].as_str(), append["v_pack"].as_str()];
            match packs {
                [Some(q), Some(k), Some(v)] if !k.is_empty() && !v.is_empty() => {
                    let (q, k, v) = (q.to_string(), k.to_string(), v.to_string());
                    let projection = match rows {
                        Some(rows) => {
                            qkv::projection(&mut body, kernel, problem, rows::CLUSTER, [&q, &k, &v], rows)?
                        }
                        None => qkv::projection(&mut body, kernel, problem, cluster, [&q, &k, &v], 1)?,
                    };
                    if let Some(p) = &projection {
                        operands.q = p.q.clone();
                        append["k_pack"] = p.k_pack.clone().into();
                        append["v_pack"] = p.v_pack.clone().into();
                    }
                    projection
                }
                _ => None,
            }
        }
        None => None,
    };
    // The output projection after it, where a batch's step allows: then a cluster is of
    // sequences of a head, each block taking all of its sequence's keys.
    let out_projection = match (&projection, rows) {
        (None, None) => outproj::projection(&mut body, kernel, problem)?,
        _ => None,
    };
    if out_projection.is_some() {
        cluster = 1;
    }
    let (half, _) = half_names(dtype);
    let (threads, unroll) = launch(projection.is_some());
    let early_scan = scan && mask_is_fixed(plan, kernel, problem);
    let early_fetch = early_scan && append.is_some() && !knobs::off("FUSEC_ATTENTION_EARLY_FETCH");
    let data = json!({
        "half": half,
        "threads": threads,
        "group": group,
        "unroll": unroll,
        "cluster": (cluster > 1).then_some(cluster),
        "scan": scan,
        "early_scan": early_scan,
        "early_fetch": early_fetch,
        // A last key past a run of keys the mask leaves out (a decoding step's own, after the
        // cache's empty slots) taken apart, so that the run is not read;
        // `FUSEC_ATTENTION_TAIL=0` reads the run, for measuring it.
        "tail": scan && !knobs::off("FUSEC_ATTENTION_TAIL"),
        // The cluster's states read all at once before they are merged;
        // `FUSEC_ATTENTION_MERGE_AT_ONCE=0` reads and merges them one block after another,
        // for measuring it.
        "merge_at_once": !knobs::off("FUSEC_ATTENTION_MERGE_AT_ONCE"),
        "keys": problem.keys_dims.c(),
        "depth": depth,
        "dv": dv,
        "k_address": k_address,
        "v_address": v_address,
        "append": append,
        "qkv": projection.as_ref().map(|p| p.data.clone()),
        "outproj": out_projection.as_ref().map(|p| p.data.clone()),
    });
    let common = Common { name, kernel, problem, body: &body, coords: coord_decls, operands };
    if let (Some(rows), Some(projection)) = (rows, &projection) {
        return rows::render(common, hb, data, rows, projection.merges.clone()).map(Some);
    }
    let mut source = common.render(hb, "attention_decode", data, 1, problem.heads() * cluster, threads)?;
    if let Some(scale) = &mut source.scale {
        scale.times = scale.times.mul(&SymDim::lit(cluster));
    }
    source.merges = projection.map(|p| p.merges).or(out_projection.map(|p| p.merges)).unwrap_or_default();
    Ok(Some(source))
}

/// What the kernel needs to append this step's key and value to the cache itself: the new
/// position (`past`), the new key's element at depth `d` and the value's at width `e` (read
/// from where the kernel before left them) and, where 8 of them from `d` (`e`) are one aligned
/// run, their address, and the cache addresses of the new position's rows at `d` and `e`.
fn appended(
    plan: &Plan,
    body: &mut Body<'_>,
    problem: &Problem,
    batch: &[String],
) -> Result<serde_json::Value, String> {
    let graph = &plan.graph;
    let rank = problem.rank();
    let dtype = graph.node(problem.anchor).ty.dtype;
    let mut part = |input: usize, last2: [&str; 2], key_axis: usize| -> Result<[String; 4], String> {
        let id = problem.inputs[input];
        let append = crate::fusion::append_behind(graph, id, key_axis)
            .filter(|a| body.read_back.contains(a))
            .ok_or("an attention kernel with appends that do not feed its keys and values")?;
        let coords = problem.input_coords(plan, input, batch, last2);
        let (_, at) = trace_back(graph, &|n| plan.dims(n), id, coords, &|n| n == append)
            .ok_or("keys or values that do not trace back to their append")?;
        let Op::Append { axis } = graph.node(append).op else { return Err("not an append".into()) };
        if at[axis].replace(['(', ')', ' '], "") != "t" {
            return Err(format!("the key axis of '{}' is not the append's", graph.node(append).name));
        }
        let inputs = graph.inputs_of(append);
        let past = plan.dims(inputs[0])[axis].c();
        let mut new = at.clone();
        new[axis] = "0LL".into();
        let value = body.read(inputs[1], new.clone())?;
        // The row's 8 elements from a multiple of 8 as one 16-byte load, where they are one
        // aligned run of the half type.
        let last = new.len() - 1;
        let pack = match body.packs_along(inputs[1], last, 8) {
            true => Some(body.address(inputs[1], new)?).filter(|(_, t)| *t == dtype).map(|(a, _)| a),
            false => None,
        };
        let mut store = at;
        store[axis] = past.clone();
        let (address, _) = body.address(append, store)?;
        Ok([past, value, pack.unwrap_or_default(), address])
    };
    let [past, k, k_pack, k_store] = part(1, ["d", "t"], rank - 1)?;
    let [v_past, v, v_pack, v_store] = part(2, ["t", "e"], rank - 2)?;
    if past != v_past {
        return Err("key and value caches of different lengths".into());
    }
    Ok(json!({
        "past": past,
        "k": k,
        "v": v,
        "k_pack": k_pack,
        "v_pack": v_pack,
        "k_store": k_store,
        "v_store": v_store,
    }))
}

/// Whether the mask reads only memory no kernel of the program writes — graph inputs other
/// than a cache appended in place, and constants — through the kernel's own ops and views:
/// then the kernel looks through it before waiting for the kernel before it (programmatic
/// dependent launch), so that the scan overlaps that kernel. `FUSEC_ATTENTION_EARLY_SCAN=0`
/// keeps the scan after the wait, for measuring it.
fn mask_is_fixed(plan: &Plan, kernel: &Kernel, problem: &Problem) -> bool {
    if knobs::off("FUSEC_ATTENTION_EARLY_SCAN") {
        return false;
    }
    let graph = &plan.graph;
    let Some(&mask) = problem.inputs.get(3) else { return false };
    let mut stack = vec![mask];
    let mut seen = std::collections::HashSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let node = graph.node(id);
        let computed_here = kernel.nodes.contains(&id) && id != problem.anchor;
        let view = !plan.locations.contains_key(&id) && node.op.is_view();
        if computed_here || view {
            stack.extend(graph.inputs_of(id));
        } else if graph.constant(id).is_some() {
            continue;
        } else if !graph.inputs().contains(&id)
            || graph.users_of(id).iter().any(|&u| matches!(graph.node(u).op, Op::Append { .. }))
        {
            return false;
        }
    }
    true
}

/// Blocks a batch × head: the most of 8, 4 and 2 that keep the launch within four blocks a
/// multiprocessor (GPT-2 small's 12 heads at batch 1: 8; 96 at batch 8: 4), else 1: a block's
/// keys go by in trips of 64 (for a 64-wide head), each a wait on memory, so fewer keys a block
/// is a shorter chain. `FUSEC_ATTENTION_CLUSTER` (1, 2, 4 or 8) overrides it, for measuring it.
fn cluster_size(heads: usize) -> usize {
    forced_cluster()
        .unwrap_or_else(|| [8, 4, 2].into_iter().find(|&c| heads * c <= 4 * MULTIPROCESSORS).unwrap_or(1))
}
