//! Attention kernels: `softmax(scale·q·kt + mask)·v` in one launch, scores never stored.
//!
//! Half-type attention (f16, bf16) runs on tensor cores (`templates/attention_mma.cu.hbs`):
//! one warp per 16 query rows, `mma.sync` for both products, online softmax in registers.
//! f32 attention keeps full f32 arithmetic on CUDA cores (`templates/attention.cu.hbs`), up
//! to 8 threads per query row (slices of the depth and value width, partial dot products
//! summed by warp shuffles). Q, K, V and the mask are read through views (transposes, reshapes,
//! head slices, the broadcasts of grouped-query attention) at the coordinates the template
//! names, so no input layout is materialised for the kernel.

use handlebars::Handlebars;
use serde_json::json;

use super::expr::{header, literal};
use super::index::{broadcast, Coords};
use super::kernel::{args, coords_decl, params, render, Body};
use super::KernelSource;
use crate::fusion::Kernel;
use crate::ir::SymDim;
use crate::ir::{DType, NodeId, Op};
use crate::plan::{Pattern, Plan};

mod decode;
mod outproj;
mod qkv;
mod rows;

/// Multiprocessors of the target GPU (H100 and H200 have 132): the tensor-core kernel picks
/// the largest block that still gives every multiprocessor a block.
const MULTIPROCESSORS: usize = 132;

/// The attention node of `kernel` and what every variant needs to know of it.
struct Problem {
    anchor: NodeId,
    scale: f32,
    nan_to_zero: bool,
    /// Output shape: batch dims…, queries, dv (at the top of any ranges).
    out: Vec<usize>,
    depth: usize,
    keys: usize,
    inputs: Vec<NodeId>,
    /// The output shape and the keys as they follow any ranges.
    out_dims: Vec<SymDim>,
    keys_dims: SymDim,
}

impl Problem {
    fn new(plan: &Plan, kernel: &Kernel) -> Result<Self, String> {
        let graph = &plan.graph;
        // The kernel's other nodes are its mask's prologue.
        let anchor = *kernel
            .nodes
            .iter()
            .find(|&&n| matches!(graph.node(n).op, Op::Attention { .. }))
            .ok_or("an attention kernel without attention")?;
        let node = graph.node(anchor);
        let Op::Attention { scale, nan_to_zero } = node.op else {
            return Err("not an attention node".into());
        };
        if !node.ty.dtype.is_float() || node.ty.dtype == DType::F64 {
            return Err(format!("attention on {} is not supported yet", node.ty.dtype));
        }
        let inputs = graph.inputs_of(anchor);
        let (q_shape, kt_shape) = (&graph.node(inputs[0]).ty.shape, &graph.node(inputs[1]).ty.shape);
        let (Some(&depth), Some(&keys)) = (q_shape.last(), kt_shape.last()) else {
            return Err("attention operands must have rank ≥ 2".into());
        };
        if node.ty.shape.len() < 2 {
            return Err("attention output must have rank ≥ 2".into());
        }
        let out_dims = plan.dims(anchor);
        let keys_dims = plan.dims(inputs[1]).last().cloned().ok_or("attention keys of rank 0")?;
        let dv_static = out_dims.last().is_some_and(SymDim::is_static);
        let depth_static = plan.dims(inputs[0]).last().is_some_and(SymDim::is_static);
        if !dv_static || !depth_static {
            return Err("attention whose head size follows a range of sizes".into());
        }
        Ok(Problem {
            anchor,
            scale,
            nan_to_zero,
            out: node.ty.shape.clone(),
            depth,
            keys,
            inputs,
            out_dims,
            keys_dims,
        })
    }

    fn rank(&self) -> usize {
        self.out.len()
    }

    fn queries(&self) -> usize {
        self.out[self.rank() - 2]
    }

    fn dv(&self) -> usize {
        self.out[self.rank() - 1]
    }

    /// Lanes that read a key in the decoding kernels: 8 elements of the depth (and of the
    /// value width) a lane, a power of two.
    fn lanes_a_key(&self) -> usize {
        self.depth.max(self.dv()).div_ceil(8).next_power_of_two()
    }

    /// Batch × heads: the product of the leading dims.
    fn heads(&self) -> usize {
        self.out[..self.rank() - 2].iter().product()
    }

    /// Queries, as a C expression.
    fn queries_c(&self) -> String {
        self.out_dims[self.rank() - 2].c()
    }

    /// How the launch follows any ranges: blocks of `qt` queries, for every batch × head.
    fn scale(&self, qt: usize) -> super::LaunchScale {
        let rank = self.rank();
        super::LaunchScale {
            units: self.out_dims[rank - 2].clone(),
            per_block: qt as u64,
            times: SymDim::product(&self.out_dims[..rank - 2]),
            bound: false,
        }
    }

    /// Query blocks of `qt`, as a C expression.
    fn qblocks_c(&self, qt: usize) -> String {
        let queries = &self.out_dims[self.rank() - 2];
        match queries.value() {
            Some(q) => format!("{}LL", q.div_ceil(qt).max(1)),
            None => format!("(({} + {qt}LL - 1) / {qt}LL)", queries.c()),
        }
    }

    /// The coordinates in input `input` (0 q, 1 kt, 2 v, 3 mask) of the element at
    /// (`batch`…, `last2`) of its virtual, broadcast shape.
    fn input_coords(&self, plan: &Plan, input: usize, batch: &[String], last2: [&str; 2]) -> Coords {
        let rank = self.rank();
        let queries = self.out_dims[rank - 2].clone();
        let (keys, depth, dv) = (self.keys_dims.clone(), SymDim::lit(self.depth), SymDim::lit(self.dv()));
        let last_dims = match input {
            0 => [queries, depth],
            1 => [depth, keys],
            2 => [keys, dv],
            _ => [queries, keys],
        };
        let virtual_shape: Vec<SymDim> = self.out_dims[..rank - 2].iter().cloned().chain(last_dims).collect();
        let coords: Coords = batch.iter().cloned().chain(last2.iter().map(|x| x.to_string())).collect();
        broadcast(&coords, &virtual_shape, &plan.dims(self.inputs[input]))
    }

    /// For the tensor-core kernel's vector accesses: the address of input `input` at
    /// (`batch`…, `last2`), when `pack` consecutive elements along `axis` (counted from the
    /// end: 1 last, 2 the one before) are one aligned run of `dtype` in memory.
    #[allow(clippy::too_many_arguments)]
    fn packed_address(
        &self,
        body: &mut Body<'_>,
        input: usize,
        batch: &[String],
        last2: [&str; 2],
        from_end: usize,
        pack: usize,
        dtype: DType,
    ) -> Result<Option<String>, String> {
        let id = self.inputs[input];
        let rank = body.plan.graph.node(id).ty.shape.len();
        if rank < 2 || !body.packs_along(id, rank - from_end, pack) {
            return Ok(None);
        }
        let coords = self.input_coords(body.plan, input, batch, last2);
        let (address, stored) = body.address(id, coords)?;
        Ok((stored == dtype).then_some(address))
    }

    /// The C expressions of q at (s, d), kt at (d, t), v at (t, e) and the mask at (s, t),
    /// where `batch` are the leading coordinates; plus the store of `y` at (s, e).
    fn operands(&self, body: &mut Body<'_>, kernel: &Kernel, batch: &[String]) -> Result<Operands, String> {
        let plan = body.plan;
        let mut read = |input: usize, last2: [&str; 2]| {
            body.read(self.inputs[input], self.input_coords(plan, input, batch, last2))
        };
        let (q, k, v) = (read(0, ["s", "d"])?, read(1, ["d", "t"])?, read(2, ["t", "e"])?);
        // The mask at (s, t): computed here where the kernel computes it (from the model's
        // `[b, k]` mask input, say) — statements, so a function `mask_at(s, t)` evaluated at
        // each score — or read from memory, or a constant's pattern written as an expression
        // (a causal mask: a comparison of s and t).
        let (mask, mask_fn) = match self.inputs.get(3) {
            Some(&m) => {
                body.statements.clear();
                body.patterns.clear();
                let coords = self.input_coords(plan, 3, batch, ["s", "t"]);
                let value = body.evaluate(m, coords, &mut Default::default())?;
                match body.statements.is_empty() {
                    true => (value, String::new()),
                    false => (
                        "mask_at(s, t)".to_string(),
                        format!(
                            "auto mask_at = [&](const long long s, const long long t) -> float {{ {} return (float)({value}); }};",
                            body.statements.join(" ")
                        ),
                    ),
                }
            }
            None => ("0.0f".into(), String::new()),
        };
        let causal = causal_limit(&body.patterns, &mask_fn);
        body.statements.clear();
        body.statements.push(format!("const float v{} = y;", self.anchor.index()));
        let out: Coords = batch.iter().cloned().chain(["s".to_string(), "e".to_string()]).collect();
        body.store(kernel, self.anchor, &out)?;
        let store = body.statements.join(" ");
        body.statements.clear();
        Ok(Operands { q, k, v, mask, mask_fn, causal, store })
    }
}

struct Operands {
    q: String,
    k: String,
    v: String,
    mask: String,
    /// The definition of `mask_at(s, t)`, where the kernel computes its mask.
    mask_fn: String,
    /// Where the mask is causal: k such that keys past query row s + k take no weight.
    causal: Option<i64>,
    store: String,
}

/// Where attention's mask is a constant causal matrix — read at (s, t), 0 or another finite
/// value where t - s ≤ k (k ≥ 0, so that every row keeps key 0), and -∞ or a value below
/// -1e30 past it — the keys past the last query row of a block (+ k) take no weight (their
/// exponentials are 0 to the last bit) and are skipped: `Some(k)`. `patterns` are the
/// constants the mask's expression stands for; `mask_fn` is empty where the mask is such a
/// constant alone.
fn causal_limit(patterns: &[(Vec<String>, Pattern)], mask_fn: &str) -> Option<i64> {
    let [(coords, Pattern::Lower { k, inside, outside })] = patterns else { return None };
    let at_s_t = coords.len() >= 2 && coords[coords.len() - 2] == "s" && coords[coords.len() - 1] == "t";
    (mask_fn.is_empty() && at_s_t && *k >= 0 && inside.is_finite() && *inside > -1e30 && *outside <= -1e30)
        .then_some(*k)
}

/// What both attention templates take besides their own tiling: names, buffers, the
/// operands' expressions, the scale and the store.
struct Common<'b, 'p> {
    name: &'b str,
    kernel: &'b Kernel,
    problem: &'b Problem,
    body: &'b Body<'p>,
    coords: Vec<String>,
    operands: Operands,
}

impl Common<'_, '_> {
    /// Renders `template` with `data` (the variant's own fields) and these, for a launch of
    /// `blocks` blocks of `threads`.
    fn render(
        self,
        hb: &Handlebars<'_>,
        template: &str,
        mut data: serde_json::Value,
        qt: usize,
        blocks: usize,
        threads: usize,
    ) -> Result<KernelSource, String> {
        let (problem, operands) = (self.problem, self.operands);
        let common = json!({
            "name": self.name,
            "headers": self.body.headers.iter().collect::<Vec<_>>(),
            "about": self.kernel.kind.name(),
            "params": super::with_limit(self.body.plan, params(self.body), false),
            "coords": self.coords,
            "q": operands.q,
            "k": operands.k,
            "v": operands.v,
            "mask": operands.mask,
            "mask_fn": operands.mask_fn,
            "causal": operands.causal.map(|k| format!("{k}LL")),
            "scale": literal(f64::from(problem.scale), DType::F32),
            "scale_log2e": literal(f64::from(problem.scale) * std::f64::consts::LOG2_E, DType::F32),
            "empty_row": if problem.nan_to_zero { "0.0f" } else { "fusec::nan()" },
            "store": operands.store,
        });
        if let (Some(data), serde_json::Value::Object(common)) = (data.as_object_mut(), common) {
            data.extend(common);
        }
        let mut source = KernelSource::new(
            self.name,
            render(hb, template, &data)?,
            u32::try_from(blocks).map_err(|_| "attention grid too large")?.max(1),
            threads as u32,
            args(self.body),
        );
        if self.body.plan.symbolic.is_some() {
            source.scale = Some(problem.scale(qt));
        }
        Ok(source)
    }
}

pub fn generate(
    plan: &Plan,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    let problem = Problem::new(plan, kernel)?;
    match plan.graph.node(problem.anchor).ty.dtype {
        DType::F16 | DType::BF16 => {
            if let Some(source) = decode::generate(plan, kernel, &problem, name, hb)? {
                return Ok(source);
            }
            if kernel.nodes.iter().any(|&n| matches!(plan.graph.node(n).op, Op::Append { .. })) {
                return Err("cache appends joined an attention that the decoding kernel does not run".into());
            }
            let top =
                mma_tiling(problem.heads(), problem.queries(), problem.keys, problem.depth, problem.dv());
            let mut source = tensor_core(plan, kernel, &problem, name, hb, top)?;
            if let Some(symbolic) = &plan.symbolic {
                // Variants for the tilings other points of the ranges call for: a short batch
                // spreads its rows over more blocks, short sequences take one tile of keys.
                let rank = problem.rank();
                let dims = super::AttentionDims {
                    heads: SymDim::product(&problem.out_dims[..rank - 2]),
                    queries: problem.out_dims[rank - 2].clone(),
                    keys: problem.keys_dims.clone(),
                    top_keys: problem.keys,
                    depth: problem.depth,
                    dv: problem.dv(),
                };
                let mut tilings: Vec<super::Tiling> = Vec::new();
                for values in sample_points(&symbolic.symbols) {
                    if let Some(t) = dims.tiling_at(&values).filter(|t| *t != top && !tilings.contains(t)) {
                        tilings.push(t);
                    }
                }
                for tiling in tilings {
                    let mut variant = tensor_core(plan, kernel, &problem, name, hb, tiling)?;
                    variant.tiling = Some(tiling);
                    source.variants.push(variant);
                }
                source.tiling = Some(top);
                source.attention = Some(Box::new(dims));
            }
            Ok(source)
        }
        _ => cuda_core(plan, kernel, &problem, name, hb),
    }
}

/// Points of the ranges to sample the attention tilings at: every combination of each
/// range's bottom, top and the powers of two between.
fn sample_points(ranges: &[crate::ir::DimRange]) -> Vec<Vec<usize>> {
    let mut points = vec![Vec::new()];
    for r in ranges {
        let mut values = vec![r.low, r.high];
        values.extend((0..usize::BITS).map(|b| 1usize << b).filter(|&v| v > r.low && v < r.high));
        points = points
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |&v| {
                    let mut p = p.clone();
                    p.push(v);
                    p
                })
            })
            .collect();
    }
    points
}

/// The tensor-core kernel's tiling for `heads` batch × heads, `queries` query rows and
/// `keys` keys of head size `depth` and value width `dv`.
pub fn mma_tiling(heads: usize, queries: usize, keys: usize, depth: usize, dv: usize) -> super::Tiling {
    let warps = warps_per_block(heads, queries);
    let qt = 16 * warps;
    let qblocks = queries.div_ceil(qt).max(1);
    let round16 = |n: usize| n.div_ceil(16).max(1) * 16;
    let (dp, dvp) = (round16(depth), round16(dv));
    // Keys per tile (a multiple of 16 for P·V): all of them in one buffer where they fit
    // (up to 128, one pass of the online softmax: sequences of 128 and less); else 64, or 32
    // for wide heads, two buffers deep. Shared memory stays within the static 48 KB.
    let smem = |buffers: usize, kt: usize| buffers * kt * (dp + 8 + dvp + 8) * 2;
    let keys = round16(keys);
    let (kt, buffers) = if keys <= 128 && smem(1, keys) <= 48 * 1024 {
        (keys, 1)
    } else if smem(2, 64) <= 48 * 1024 {
        (keys.min(64), 2)
    } else {
        (keys.min(32), 2)
    };
    // Warps sharing each query row group's key tiles: their merge goes through the key
    // buffer, so it must fit there, and each share is a multiple of 16 keys (for P·V).
    let merge_bytes = |splits: usize| (splits - 1) * warps * 32 * (dvp / 2 + 4) * 4;
    let splits = key_splits(heads * qblocks * warps)
        .into_iter()
        .find(|&n| kt % (16 * n) == 0 && merge_bytes(n) <= buffers * kt * (dp + 8) * 2)
        .unwrap_or(1);
    let cluster = cluster_size(
        heads * qblocks,
        keys.div_ceil(kt),
        warps * 32 * (dvp / 2 + 4) * 4 <= kt * (dvp + 8) * 2,
    );
    super::Tiling { warps, splits, kt, buffers, cluster }
}

/// Blocks of a cluster sharing each query block's key tiles, for `blocks` query blocks in all
/// over `tiles` tiles of keys: where the blocks leave most of the chip idle (decoding: one
/// query a sequence, a long cache), 4, else 2, where that keeps the launch within one wave and
/// gives the cluster's first blocks two tiles or more — "split-K" attention, the partial
/// softmax states merged through distributed shared memory. Clusters of 8 measured slower
/// than 4 on GPT-2 small's decoding at caches of 384 and 2,048 (`benches/NOTES.md`). `fits`:
/// whether a block's states fit its value buffer for the merge. `FUSEC_ATTENTION_CLUSTER`
/// (1, 2, 4 or 8) overrides the choice, for measuring it.
fn cluster_size(blocks: usize, tiles: usize, fits: bool) -> usize {
    if !fits {
        return 1;
    }
    if let Some(c) = forced_cluster() {
        return c;
    }
    [4, 2].into_iter().find(|&c| blocks * c <= MULTIPROCESSORS && tiles.div_ceil(c) >= 2).unwrap_or(1)
}

/// `FUSEC_ATTENTION_CLUSTER` where it is 1, 2, 4 or 8: blocks a cluster, for measuring the
/// attention kernels' choice.
fn forced_cluster() -> Option<usize> {
    crate::knobs::one_of("FUSEC_ATTENTION_CLUSTER", &[1, 2, 4, 8])
}

/// The C names of half type `dtype` (f16 unless bf16) and of the conversion to it from f32.
fn half_names(dtype: DType) -> (&'static str, &'static str) {
    match dtype {
        DType::BF16 => ("__nv_bfloat16", "__float2bfloat16_rn"),
        _ => ("__half", "__float2half_rn"),
    }
}

/// Warps per block of the tensor-core kernel: the most (up to 4) that still give every
/// multiprocessor a block, so that small batches spread over the chip.
/// `FUSEC_ATTENTION_WARPS` (1, 2, 4 or 8) overrides the choice, for measuring the variants.
fn warps_per_block(heads: usize, queries: usize) -> usize {
    if let Some(w) = crate::knobs::one_of("FUSEC_ATTENTION_WARPS", &[1, 2, 4, 8]) {
        return w;
    }
    [4, 2, 1].into_iter().find(|&w| heads * queries.div_ceil(16 * w) >= MULTIPROCESSORS).unwrap_or(1)
}

fn tensor_core(
    plan: &Plan,
    kernel: &Kernel,
    problem: &Problem,
    name: &str,
    hb: &Handlebars<'_>,
    tiling: super::Tiling,
) -> Result<KernelSource, String> {
    let dtype = plan.graph.node(problem.anchor).ty.dtype;
    let (half, to_half) = half_names(dtype);
    let mut body = Body::new(plan, kernel);
    body.headers.extend(header(dtype));
    let rank = problem.rank();
    let (coord_decls, batch) = coords_decl("c", "bh", &problem.out_dims[..rank - 2]);
    let operands = problem.operands(&mut body, kernel, &batch)?;
    let (queries, heads) = (problem.queries(), problem.heads());
    let super::Tiling { warps, splits, kt, buffers, cluster } = tiling;
    let qt = 16 * warps;
    let qblocks = queries.div_ceil(qt).max(1);
    let round16 = |n: usize| n.div_ceil(16).max(1) * 16;
    let (dp, dvp) = (round16(problem.depth), round16(problem.dv()));
    // 16-byte copies where 8 consecutive depth (K) or value (V) elements are contiguous.
    let k_address = match problem.depth % 8 {
        0 => problem.packed_address(&mut body, 1, &batch, ["d", "t"], 2, 8, dtype)?,
        _ => None,
    };
    let v_address = match problem.dv() % 8 {
        0 => problem.packed_address(&mut body, 2, &batch, ["t", "e"], 1, 8, dtype)?,
        _ => None,
    };
    // Q fragments read as 32-bit words where pairs of depth elements are contiguous.
    let q_address = match problem.depth % 2 {
        0 => problem.packed_address(&mut body, 0, &batch, ["s", "d"], 1, 2, dtype)?,
        _ => None,
    };
    // The output stored as 32-bit pairs where two consecutive value elements are adjacent.
    let out_address = match problem.dv() % 2 {
        0 => {
            let out: Vec<String> = batch.iter().cloned().chain(["s".to_string(), "e".to_string()]).collect();
            body.store_address(kernel, problem.anchor, &out, 2)?
        }
        _ => None,
    };
    let data = json!({
        "last_chunks": last_chunks(problem, operands.causal.is_some(), kt, splits * cluster),
        "cluster": (cluster > 1).then_some(cluster),
        "skip_masked": skip_masked(problem, operands.causal.is_some(), buffers),
        "live_words": problem.keys.div_ceil(kt).div_ceil(32).max(1),
        "merges": splits > 1 || cluster > 1,
        "half": half,
        "to_half": to_half,
        "warps": warps,
        "splits": splits,
        "split": splits > 1,
        "kw": kt / splits,
        "threads": 32 * warps * splits,
        "qt": qt,
        "qblocks": problem.qblocks_c(qt),
        "kt": kt,
        "kv_buffers": buffers,
        "queries": problem.queries_c(),
        "keys": problem.keys_dims.c(),
        "tiles_const": if problem.keys_dims.is_static() { "constexpr" } else { "const" },
        "tiles_keys": problem.keys_dims.value().map_or_else(|| problem.keys_dims.c(), |k| k.to_string()),
        "depth": problem.depth,
        "dp": dp,
        "k_pairs": (dp / 16) % 2 == 0,
        "dv": problem.dv(),
        "dvp": dvp,
        "q_pairs": q_address.is_some(),
        "q_address": q_address.unwrap_or_default(),
        "k_async": k_address.is_some(),
        "k_address": k_address.unwrap_or_default(),
        "v_async": v_address.is_some(),
        "v_address": v_address.unwrap_or_default(),
        "out_pairs": out_address.is_some(),
        "out_address": out_address.unwrap_or_default()
    });
    let common = Common { name, kernel, problem, body: &body, coords: coord_decls, operands };
    let mut source =
        common.render(hb, "attention_mma", data, qt, qblocks * heads * cluster, 32 * warps * splits)?;
    // A cluster's blocks for every query block.
    if let Some(scale) = &mut source.scale {
        scale.times = scale.times.mul(&SymDim::lit(cluster));
    }
    Ok(source)
}

/// Where the keys are known at compile time and their last tile holds fewer 8-key chunks than
/// a whole one, how many it holds: the kernel compiles that tile's products for those only
/// (rather than branching on the key count inside the unrolled loops, which measured slower).
/// Not with a causal mask (each query block's last tile differs) or a tile shared by warps.
/// `FUSEC_ATTENTION_LAST_TILE=0` turns it off, for measuring it.
fn last_chunks(problem: &Problem, causal: bool, kt: usize, splits: usize) -> Option<usize> {
    if causal || splits != 1 || crate::knobs::off("FUSEC_ATTENTION_LAST_TILE") {
        return None;
    }
    let keys = problem.keys_dims.value()?;
    let last = keys - keys.saturating_sub(1) / kt * kt;
    Some(last.div_ceil(8)).filter(|&c| c < kt / 8 && c > 0)
}

/// Whether the kernel skips key tiles its mask weighs nothing in for a block's rows: a
/// decoding step's attention (at most 16 query rows, one warp's) with a mask that is not the
/// causal constant, over more than one tile of keys — a cache's empty slots (a step compiled
/// for a cache of some capacity) are then not read. The block looks through the mask for all
/// its tiles once, while its first two tiles are copied; for more query rows that look would
/// cost more than it saves (looking tile by tile, before each copy, measured slower: the
/// copies waited on the mask's reads). `FUSEC_ATTENTION_SKIP=0` turns it off, for measuring it.
fn skip_masked(problem: &Problem, causal: bool, buffers: usize) -> bool {
    problem.inputs.len() > 3
        && !causal
        && buffers > 1
        && problem.queries() <= 16
        && !crate::knobs::off("FUSEC_ATTENTION_SKIP")
}

/// How many warps may share each group of query rows' keys, most preferred first, for a
/// launch of `warps` query warps in all: four where those are fewer than four per
/// multiprocessor (a short batch: on the H100, 1×128 with 12 heads took 6.5 µs per layer
/// unsplit and 4.6 µs split four ways), else none (8×128 and 32×128 measured the same either
/// way). `FUSEC_ATTENTION_SPLITS` (1, 2 or 4) overrides the choice, for measuring it.
fn key_splits(warps: usize) -> Vec<usize> {
    if let Some(n) = crate::knobs::one_of("FUSEC_ATTENTION_SPLITS", &[1, 2, 4]) {
        return vec![n, 1];
    }
    if warps < 4 * MULTIPROCESSORS {
        vec![4, 2, 1]
    } else {
        vec![1]
    }
}

/// f32 attention on CUDA cores: up to 8 threads per query row, K/V tiles in shared memory.
fn cuda_core(
    plan: &Plan,
    kernel: &Kernel,
    problem: &Problem,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<KernelSource, String> {
    let mut body = Body::new(plan, kernel);
    let rank = problem.rank();
    let (coord_decls, batch) = coords_decl("c", "bh", &problem.out_dims[..rank - 2]);
    let operands = problem.operands(&mut body, kernel, &batch)?;
    let (queries, heads, depth, dv) = (problem.queries(), problem.heads(), problem.depth, problem.dv());
    // Small problems get blocks of 32 rows so that more SMs have work.
    let qt: usize = if heads * queries.div_ceil(64) < 2 * MULTIPROCESSORS { 32 } else { 64 };
    // Threads per query row: the most (up to 8, lanes of one warp) that divide the depth and
    // the value width; each holds a slice of q and of the output.
    let rt = [8usize, 4, 2, 1].into_iter().find(|r| depth % r == 0 && dv % r == 0).unwrap_or(1);
    let qblocks = queries.div_ceil(qt).max(1);
    // Keys per shared-memory tile: a multiple of the chunk, within 40 KB of f32 K and V.
    let chunk = 4usize;
    let kt = ((40 * 1024 / (4 * (depth + dv).max(1))) / chunk * chunk).clamp(chunk, 32);
    let data = json!({
        "qt": qt,
        "rt": rt,
        "threads": qt * rt,
        "qblocks": problem.qblocks_c(qt),
        "kt": kt,
        "chunk": chunk,
        "queries": problem.queries_c(),
        "keys": problem.keys_dims.c(),
        "depth": depth,
        "dv": dv
    });
    let common = Common { name, kernel, problem, body: &body, coords: coord_decls, operands };
    common.render(hb, "attention", data, qt, qblocks * heads, qt * rt)
}
