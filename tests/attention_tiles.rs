//! Attention over a key count that leaves the last shared-memory tile partly empty (a vision
//! transformer's 197 tokens in tiles of 64): the tensor-core kernel compiles that last tile's
//! products for the 8-key chunks it holds only. f16 programs at 150, 184 and 197 keys (an odd
//! chunk count, seven, one); every kernel through NVRTC where it is found (the attention
//! kernel through ptxas too: no spills), and the bundle against tract on a GPU. And attention
//! of a few queries over many keys (a step of a short prompt over a long cache): too few blocks
//! for the chip, so clusters of blocks split the keys and merge their softmax states (compiled
//! for an arch without clusters, the first block of each group does the work alone); of one
//! query (a decoding step), the decoding kernel, its live keys split over a cluster alike.

mod common;

use std::path::{Path, PathBuf};

use common::onnx::{floats, int, int64s, ints, node, weight, write_model};
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

/// Self-attention of one 64-wide head over `tokens` positions, 48 sequences (so that the
/// launch fills the chip with blocks of four warps and no warps share a key tile).
fn self_attention(dir: &Path, tokens: i64) -> PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "wq"], "q", vec![]),
        node("MatMul", &["x", "wk"], "k", vec![]),
        node("MatMul", &["x", "wv"], "v", vec![]),
        node("Transpose", &["k"], "kt", vec![ints("perm", &[0, 2, 1])]),
        node("MatMul", &["q", "kt"], "s", vec![]),
        node("Mul", &["s", "scale"], "scaled", vec![]),
        node("Softmax", &["scaled"], "p", vec![int("axis", -1)]),
        node("MatMul", &["p", "v"], "out", vec![]),
    ];
    let init = vec![
        weight("wq", &[64, 64], 81, -0.3, 0.6),
        weight("wk", &[64, 64], 82, -0.3, 0.6),
        weight("wv", &[64, 64], 83, -0.3, 0.6),
        floats("scale", &[0.125]),
    ];
    write_model(dir, &format!("attention{tokens}"), &[48, tokens, 64], nodes, init)
}

/// The last `queries` positions' queries over `tokens` keys, 12 sequences of one 64-wide head;
/// with `valid`, the keys from that one on masked out by -inf (a cache's empty slots).
fn last_query(dir: &Path, tokens: i64, queries: i64, valid: Option<i64>) -> PathBuf {
    last_query_of(dir, 64, tokens, queries, valid)
}

/// [`last_query`] for a head `width` wide (scaled by `1 / sqrt(width)`).
fn last_query_of(dir: &Path, width: i64, tokens: i64, queries: i64, valid: Option<i64>) -> PathBuf {
    last_query_masked(dir, width, tokens, queries, valid.map(|v| (v, false)))
}

/// [`last_query_of`] with `live`: the first `live.0` keys live, and where `live.1`, the last
/// key as well (a decoding step's own key after a cache's empty slots).
fn last_query_masked(
    dir: &Path,
    width: i64,
    tokens: i64,
    queries: i64,
    live: Option<(i64, bool)>,
) -> PathBuf {
    let valid = live.map(|(v, _)| v);
    let mut nodes = vec![
        node("MatMul", &["x", "wq"], "qs", vec![]),
        node("Slice", &["qs", "starts", "ends", "axes"], "q", vec![]),
        node("MatMul", &["x", "wk"], "k", vec![]),
        node("MatMul", &["x", "wv"], "v", vec![]),
        node("Transpose", &["k"], "kt", vec![ints("perm", &[0, 2, 1])]),
        node("MatMul", &["q", "kt"], "s", vec![]),
        node("Mul", &["s", "scale"], "scaled", vec![]),
        node("Softmax", &[if valid.is_some() { "masked" } else { "scaled" }], "p", vec![int("axis", -1)]),
        node("MatMul", &["p", "v"], "out", vec![]),
    ];
    let mut init = vec![
        weight("wq", &[width, width], 91, -0.3, 0.6),
        weight("wk", &[width, width], 92, -0.3, 0.6),
        weight("wv", &[width, width], 93, -0.3, 0.6),
        floats("scale", &[1.0 / (width as f32).sqrt()]),
        int64s("starts", &[tokens - queries]),
        int64s("ends", &[tokens]),
        int64s("axes", &[1]),
    ];
    if let Some(valid) = valid {
        nodes.insert(7, node("Add", &["scaled", "mask"], "masked", vec![]));
        let last = live.is_some_and(|(_, last)| last);
        let mask: Vec<f32> = (0..tokens)
            .map(|t| if t < valid || (last && t == tokens - 1) { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        init.push(floats("mask", &mask));
    }
    let last = if live.is_some_and(|(_, last)| last) { "_last" } else { "" };
    let name = format!("last{width}_{tokens}_{queries}_{}{last}", valid.unwrap_or(tokens));
    write_model(dir, &name, &[12, tokens, width], nodes, init)
}

fn half() -> CompileOptions {
    CompileOptions { precision: DType::F16, ..Default::default() }
}

#[test]
fn a_partial_last_key_tile_is_compiled_for_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    // Keys in the last tile of 64, and the chunks of 8 the kernel compiles it for.
    for (tokens, chunks) in [(150, 3), (184, 7), (197, 1)] {
        let path = self_attention(dir.path(), tokens);
        let steps = common::compiled_steps(&path, &half());
        let attention: Vec<_> = steps
            .iter()
            .flat_map(Step::sources)
            .filter(|k| k.source.contains("mma_m16n8k16") && k.source.contains("tile_at"))
            .collect();
        assert_eq!(attention.len(), 1, "{tokens} keys: one tensor-core attention kernel");
        let source = &attention[0].source;
        let last = format!("tile_at(tiles - 1, fusec::Constant<{chunks}>{{}}, fusec::Constant<1>{{}})");
        assert!(source.contains(&last), "{tokens} keys: no `{last}` in\n{source}");
        // The tiles before it hold keys only: no compare with the key count in them.
        let full = "tile_at(step, fusec::Constant<64 / 8>{}, fusec::Constant<0>{})";
        assert!(source.contains(full), "{tokens} keys: no `{full}` in\n{source}");
        if fusec::nvrtc::available() {
            common::compiles_without_spills(attention[0], common::ptxas().as_deref(), dir.path());
        }

        let (_, inputs, theirs) = common::tract_on_random_inputs(&path, tokens as u64);
        common::gpu_matches_tract(&path, &half(), &inputs, &theirs, 1e-2);
    }
}

#[test]
fn two_queries_over_a_long_cache_split_their_keys_over_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // 12 query blocks: 1,000 keys (16 tiles of 64) and 300 (5 tiles) over clusters of 4, 150 (3
    // tiles) of 2; 1,000 keys of which the first 380 are not masked out: tiles masked whole are
    // skipped.
    for (tokens, cluster, valid) in [(1000, 4, None), (300, 4, None), (150, 2, None), (1000, 4, Some(380))] {
        let path = last_query(dir.path(), tokens, 2, valid);
        split_keys(
            dir.path(),
            &path,
            "mma_m16n8k16",
            cluster,
            ("atomicOr(&live", valid.is_some()),
            tokens as u64,
        );
    }
}

/// One query over `tokens` keys (a decoding step): the decoding kernel, 12 batch × heads in
/// clusters of 8 blocks; where a mask is read, the block finds the keys that weigh anything
/// from it first (1,000 keys of which the first 380 are live). Odd counts (77, 301) leave lane
/// groups and blocks with fewer keys than others. The last key live after a run of dead ones
/// (a decoding step's own key after a cache's empty slots) is taken on its own, the run not
/// read; so is one live key after a single dead one (300 live of 302).
#[test]
fn one_query_runs_in_the_decoding_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (1000, None),
        (301, None),
        (77, None),
        (1000, Some((380, false))),
        (301, Some((5, false))),
        (1000, Some((380, true))),
        (302, Some((300, true))),
        (77, Some((1, true))),
    ];
    for (tokens, live) in cases {
        let path = last_query_masked(dir.path(), 64, tokens, 1, live);
        split_keys(
            dir.path(),
            &path,
            "Attention of one query row",
            8,
            (SCANS, live.is_some()),
            tokens as u64,
        );
    }
}

/// What the decoding kernel's source holds where it looks through its mask first.
const SCANS: &str = "bounds[warp][2] = lst2";

/// The one kernel of `path`'s f16 program whose source holds `marker`: clusters of `cluster`
/// blocks, one for each of the 12 query blocks; looking through its mask first (`looks` in its
/// source) just where `masked`; no spills, and compiled for sm_80 too (no clusters there: the
/// first block of each group works alone). Then the program against tract on a GPU, on random
/// inputs drawn from `seed`.
fn split_keys(dir: &Path, path: &Path, marker: &str, cluster: u32, (looks, masked): (&str, bool), seed: u64) {
    let name = path.display();
    let steps = common::compiled_steps(path, &half());
    // The attention kernel: the query rows' projection, a product of a few rows now that the
    // slice of them is taken before it (`slice-early`), may also run on tensor cores.
    let kernels: Vec<_> = steps
        .iter()
        .flat_map(Step::sources)
        .filter(|k| k.source.contains(marker) && k.source.contains("fusec_attention"))
        .collect();
    assert_eq!(kernels.len(), 1, "{name}: one attention kernel with `{marker}`");
    let kernel = kernels[0];
    let dims = format!("FUSEC_CLUSTER_DIMS({cluster})");
    assert!(kernel.source.contains(&dims), "{name}: no `{dims}` in\n{}", kernel.source);
    assert_eq!(kernel.grid, 12 * cluster, "{name}: a cluster for each query block");
    assert_eq!(kernel.source.contains(looks), masked, "{name}: `{looks}`");
    // The decoding kernel takes a live last key past dead ones on its own wherever it looks
    // through the mask.
    if looks == SCANS {
        assert_eq!(kernel.source.contains("tail = lst;"), masked, "{name}: the last key apart");
    }
    if fusec::nvrtc::available() {
        common::compiles_without_spills(kernel, common::ptxas().as_deref(), dir);
        fusec::nvrtc::compile(kernel, "sm_80").unwrap_or_else(|e| panic!("{name} for sm_80: {e}"));
    }
    let (_, inputs, theirs) = common::tract_on_random_inputs(path, seed);
    common::gpu_matches_tract(path, &half(), &inputs, &theirs, 1e-2);
}

/// The decoding kernel at other head sizes: 80 and 96 (lanes past the head's last 8-element
/// pack load zeros), 128 and 256 (a whole warp a key): no spills, and against tract on a GPU.
#[test]
fn one_query_runs_in_the_decoding_kernel_at_other_head_sizes() {
    let dir = tempfile::tempdir().unwrap();
    for (width, valid) in [(80, None), (96, Some(200)), (128, None), (256, Some(150))] {
        let path = last_query_of(dir.path(), width, 301, 1, valid);
        split_keys(dir.path(), &path, "Attention of one query row", 8, (SCANS, valid.is_some()), 301);
    }
}
