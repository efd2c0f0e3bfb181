//! A decoding step of a batch of sequences whose attention kernel computes its own Q, K and V
//! projection (`templates/attention_decode_rows.cu.hbs`): at one sequence the decoding kernel
//! does so already (`super::qkv`), each block of a head's cluster taking a share of the head's
//! columns; at a few rows the product is on tensor cores and its weights are read once for
//! every row, so a cluster of [`CLUSTER`] blocks a head takes a share of K each for every row,
//! and the blocks add their sums for their own rows through distributed shared memory, then
//! run those rows' attention. The product's step and its norm's are left out: a layer of a
//! batch's step loses a dependent kernel.

use serde_json::json;

use super::{Common, Problem};
use crate::codegen::KernelSource;
use crate::fusion::Kernel;
use crate::ir::NodeId;
use crate::plan::Plan;

/// Blocks a head: each takes an eighth of K.
pub(super) const CLUSTER: usize = 8;
/// Threads a block where a head has one cluster: the rows' teams of warps (eight warps a row
/// at 16 rows), a warp a tile of 16 of the head's columns in the product (GPT-2 small's 192:
/// 12 warps, four idle there). The keys a block has in flight are its threads': with one
/// cluster a head at 32 rows GPT-2 small's step took 0.418–0.421 ms a token at 384 threads,
/// 0.414–0.416 at 512 (`benches/NOTES.md`, fifty-second session); ptxas fits 512 in 128
/// registers without spills (GPT-2 small's sizes, sm_90).
const THREADS: usize = 512;

/// [`THREADS`], unless `FUSEC_ATTENTION_ROWS_THREADS` (256, 384 or 512) says otherwise, for
/// measuring it.
fn threads() -> usize {
    crate::knobs::one_of("FUSEC_ATTENTION_ROWS_THREADS", &[256, 384, 512]).unwrap_or(THREADS)
}
/// Chunks of 32 down K a block at most (their weights are held in registers across the wait).
const MOST_CHUNKS: usize = 4;
/// Static shared memory a block may use.
const SHARED_BYTES: usize = 48 * 1024;

/// The rows (sequences) of a batch whose decoding step this kernel can take: one query row
/// each, the batch the leading of two batch axes (batch, heads), 2 to
/// [`crate::plan::projected_rows`] rows, and a mask the keys are found from (`scan`).
pub(super) fn batch(problem: &Problem, scan: bool) -> Option<usize> {
    let out = &problem.out;
    let rows = *out.first()?;
    let fits = out.len() == 4 && out[2] == 1 && crate::plan::projects_batch(rows);
    (fits && scan).then_some(rows)
}

/// Rows a block: the batch over the cluster's blocks, a power of two (so that the block's
/// warps split evenly into teams).
fn rows_per_block(rows: usize) -> usize {
    rows.div_ceil(CLUSTER).next_power_of_two()
}

/// The most rows a cluster takes: past them a head has clusters for its rows in turn, of
/// [`SPLIT_THREADS`] threads a block and two blocks a multiprocessor, so that a step of 32
/// rows has 192 blocks on the 132 multiprocessors, not 96.
const GROUP_ROWS: usize = 16;
/// Threads a block where a head has several clusters.
const SPLIT_THREADS: usize = 256;

/// How the kernel is launched at `rows` rows: clusters a head, rows a cluster, rows a block,
/// threads a block and the blocks a multiprocessor its launch bounds ask for.
struct Launch {
    groups: usize,
    group_rows: usize,
    rows_per_block: usize,
    threads: usize,
    blocks_per_sm: usize,
}

fn launch(rows: usize) -> Launch {
    let groups = rows.div_ceil(GROUP_ROWS);
    let group_rows = rows.div_ceil(groups);
    let (threads, blocks_per_sm) = if groups > 1 { (SPLIT_THREADS, 2) } else { (threads(), 1) };
    Launch { groups, group_rows, rows_per_block: rows_per_block(group_rows), threads, blocks_per_sm }
}

/// Whether a projection of K `k` fits the kernel at `rows` rows: K in chunks of 32, at most
/// [`MOST_CHUNKS`] of them a block, the head's columns in tiles of 16 (two a warp at most),
/// and the shared memory within [`SHARED_BYTES`].
pub(super) fn fits(problem: &Problem, k: usize, rows: usize) -> bool {
    let launch = launch(rows);
    let group = problem.lanes_a_key();
    let slots = 2 * problem.depth + problem.dv();
    let chunks = k / 32;
    let per_block = chunks.div_ceil(CLUSTER);
    let warps = launch.threads / 32;
    let rb = launch.rows_per_block;
    let padded = launch.group_rows.div_ceil(8) * 8;
    let shared = padded * (per_block * 32 + 8) * 2
        + padded * (slots + 4) * 4
        + 2 * padded * 4
        + rb * (slots * 2 + 4)
        + warps * (2 + 8 * group) * 4
        + warps * 12;
    k % 32 == 0
        && per_block <= MOST_CHUNKS
        && slots % 16 == 0
        && slots / 16 <= 2 * warps
        && warps % rb == 0
        && (warps / rb * 32) % group == 0
        && shared <= SHARED_BYTES
}

/// Whether the leading axis of `id` (its batch of `rows` sequences) is, through views only,
/// the leading axis of the stored value `c`, whose elements after it are `n` (a row of the
/// product): then element (b, …) of `id` is at b·n plus what the other coordinates give.
pub(super) fn batch_leads(
    plan: &Plan,
    kernel: &Kernel,
    id: NodeId,
    c: NodeId,
    rows: usize,
    n: usize,
) -> bool {
    use crate::ir::Op;
    let graph = &plan.graph;
    let stored = |n: NodeId| plan.locations.contains_key(&n) && !kernel.nodes.contains(&n);
    let shape = |id: NodeId| -> Option<Vec<usize>> { plan.dims(id).iter().map(|d| d.value()).collect() };
    // The axis is `axis` of `dims`, every axis before it of one element.
    let leading =
        |dims: &[usize], axis: usize| dims.get(axis) == Some(&rows) && dims[..axis].iter().all(|&d| d == 1);
    let (mut id, mut axis) = (id, 0usize);
    loop {
        let Some(dims) = shape(id) else { return false };
        if stored(id) {
            return id == c && leading(&dims, axis) && dims[axis + 1..].iter().product::<usize>() == n;
        }
        let Some(&input) = graph.inputs_of(id).first() else { return false };
        let Some(in_dims) = shape(input) else { return false };
        axis = match &graph.node(id).op {
            Op::Reshape { .. } => {
                // Leading in both, of the same size: the rest of the linear index is b-free.
                let Some(a) = in_dims.iter().position(|&d| d != 1) else { return false };
                if !leading(&dims, axis) || !leading(&in_dims, a) {
                    return false;
                }
                a
            }
            Op::Transpose { perm } => match perm.get(axis) {
                Some(&p) => p,
                None => return false,
            },
            Op::Slice { axes } => match axes.get(axis) {
                Some(s) if s.start == 0 && s.step == 1 && in_dims.get(axis) == Some(&rows) => axis,
                _ => return false,
            },
            Op::Identity | Op::Dropout => axis,
            _ => return false,
        };
        id = input;
    }
}

/// The kernel's source: `data` the decoding kernel's fields (the operands' addresses, the
/// appends, the projection), to which the launch's are added.
pub(super) fn render(
    common: Common<'_, '_>,
    hb: &handlebars::Handlebars<'_>,
    mut data: serde_json::Value,
    rows: usize,
    merges: Vec<usize>,
) -> Result<KernelSource, String> {
    let problem = common.problem;
    let heads = problem.out[1];
    let launch = launch(rows);
    let data_early_scan = data["early_scan"] == true;
    if let Some(fields) = data.as_object_mut() {
        let values = json!({
            "threads": launch.threads,
            "blocks_per_sm": launch.blocks_per_sm,
            // The first trip's keys requested before the wait (where the scan is made there).
            "fetch_early": launch.groups == 1 && data_early_scan,
            "cluster": CLUSTER,
            "rows": rows,
            "groups": launch.groups,
            "group_rows": launch.group_rows,
            "rows_per_block": launch.rows_per_block,
            "heads": heads,
        });
        if let serde_json::Value::Object(values) = values {
            fields.extend(values);
        }
    }
    let blocks = heads * launch.groups * CLUSTER;
    let mut source = common.render(hb, "attention_decode_rows", data, 1, blocks, launch.threads)?;
    source.merges = merges;
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 32 rows are four a block, 8 one, 9 to 16 two; the block's warps split into teams.
    #[test]
    fn rows_spread_over_the_cluster() {
        assert_eq!(rows_per_block(32), 4);
        assert_eq!(rows_per_block(24), 4);
        assert_eq!(rows_per_block(16), 2);
        assert_eq!(rows_per_block(9), 2);
        assert_eq!(rows_per_block(8), 1);
        assert_eq!(rows_per_block(2), 1);
    }

    /// Past 16 rows a head has two clusters, each for half of them, two blocks a
    /// multiprocessor.
    #[test]
    fn many_rows_take_two_clusters_a_head() {
        let at = |rows: usize| {
            let l = launch(rows);
            (l.groups, l.group_rows, l.rows_per_block, l.blocks_per_sm)
        };
        assert_eq!(at(16), (1, 16, 2, 1));
        assert_eq!(at(17), (2, 9, 2, 2));
        assert_eq!(at(32), (2, 16, 2, 2));
        assert_eq!(at(8), (1, 8, 1, 1));
    }
}
