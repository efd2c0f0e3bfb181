//! A GEMM of a few rows (a decoding step: one token a sequence) as a kernel of fusec's
//! (`templates/skinny_gemm.cu.hbs`; tens of rows in half types on tensor cores, `mma.rs`),
//! kept beside the library call in the step: such a product is bound by reading its weights
//! once, and cuBLAS's kernels for it leave much of the GPU's bandwidth unused. The runtime
//! times both in the program and keeps the faster (as it chooses cuBLASLt algorithms); the
//! epilogue cuBLASLt would run (α, bias, residual, ReLU or tanh-GELU) runs in the kernel's
//! last step.

mod gate;
mod mma;
mod staged;

pub use gate::{gate_before, Gate};

use handlebars::Handlebars;
use serde_json::json;

use super::expr::{c_type, header, load, narrow};
use super::gemm::{GemmSpec, LtActivation};
use super::kernel::render;
use super::KernelSource;
use crate::ir::{DType, NodeId, Op};
use crate::knobs::{self, one_of};
use crate::plan::{Location, Plan};

/// The most rows of A the kernel on CUDA cores takes (its sums are `rows × pack` registers a
/// thread); more, up to [`mma::MAX_ROWS`], go to the tensor-core kernel.
pub const MAX_ROWS: usize = 8;

/// Threads per block of a `[K, N]` operand's kernel.
const COLS_BLOCK: usize = 256;

/// Warps per block of an `[N, K]` operand's kernel.
const ROWS_WARPS: usize = 4;

/// The most registers of A's values a thread of the norm's or the gate's prologue has in flight
/// at once (one a value, four a pack of each factor): its loads come in groups that fill at most
/// this many, each group's issued before the first is used.
const LOADS_AT_ONCE: usize = 32;

/// The most bytes of a norm's scale (and of its shift) a few-row kernel copies into shared
/// memory ([`norm_staged`]).
const NORM_STAGED_BYTES: usize = 16 << 10;

/// Columns from which an `[N, K]` operand's product of one or two rows is a vocabulary's
/// projection, read eight columns a warp.
const WIDE: usize = 16384;

/// The most gates (rows × K) a block computes into shared memory (40 KB of f32), where the
/// kernel takes a gated MLP's gate in; more leave the gate to its own kernel.
const GATE_FLOATS: usize = 10240;

/// A LayerNorm (or RMSNorm) over the last axis of A, computed in the kernel from its input
/// rather than by the row kernel before it (whose step the runtime then leaves out). Where that
/// kernel also adds the residual stream (`h = x + y`, the norm of `h`), the kernel adds it too,
/// and its first block writes `h` for the layers after.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Norm {
    /// The step of the norm's own kernel.
    pub step: usize,
    /// The norm's input, `[M, K]`, of the GEMM's element type (or the sum's first term).
    pub x: Location,
    /// The sum's second term and where the sum is stored (where a later kernel reads it),
    /// where the norm is of a sum.
    pub sum: Option<(Location, Option<Location>)>,
    /// Its scale, `K` elements (none where folded into the weights, `passes::FoldNormScales`).
    pub gamma: Option<Location>,
    /// Its shift (a LayerNorm's), `K` elements.
    pub beta: Option<Location>,
    /// Added to the variance (mean square).
    pub epsilon: f32,
    /// RMSNorm: no mean taken out, no shift.
    pub rms: bool,
    /// An RMSNorm of the deviations ([`Op::RmsNorm`]'s `deviation`): the statistics a
    /// LayerNorm's, no mean taken out of x.
    pub deviation: bool,
}

/// What the kernel computes A from where it is not A as stored, standing in for the kernel
/// before the GEMM's (whose step the runtime then leaves out).
#[derive(Clone, Copy, Debug)]
pub enum Prologue<'a> {
    /// A LayerNorm or RMSNorm of A's rows (of a sum of two).
    Norm(&'a Norm),
    /// A gated MLP's gate, `x · σ(x) · y`.
    Gate(&'a Gate),
}

impl Prologue<'_> {
    /// The step of the kernel it stands in for.
    pub fn step(&self) -> usize {
        match self {
            Prologue::Norm(norm) => norm.step,
            Prologue::Gate(gate) => gate.step,
        }
    }
}

/// A's element `a` (a float expression) normalised: its row's statistics (`mean[m]`,
/// `rstd[m]`), then the scale and shift at column `column`, read from `gamma` and `beta` as
/// stored, or, where the kernel staged them ([`norm_staged`]), from the expressions `staged`
/// gives (`ng[k]`, or a pack's element `gp.v[v]` read from `ng` once for its lanes).
fn norm_expr(
    a: String,
    column: &str,
    norm: Option<&Norm>,
    dtype: DType,
    staged: Option<(&str, &str)>,
) -> String {
    let Some(norm) = norm else { return a };
    let (gamma, beta) = match staged {
        Some((scale, shift)) => (scale.to_string(), shift.to_string()),
        None => (format!("gamma[{column}]"), format!("beta[{column}]")),
    };
    let centred = if norm.rms { a } else { format!("({a} - mean[m])") };
    let scaled = match norm.gamma {
        Some(_) => format!("{centred} * rstd[m] * {}", load(&gamma, dtype)),
        None => format!("{centred} * rstd[m]"),
    };
    match norm.beta {
        Some(_) => format!("({scaled} + {})", load(&beta, dtype)),
        None => format!("({scaled})"),
    }
}

/// Whether the kernel copies the norm's scale and shift into shared memory before its wait
/// (`ng`, `nb` in the template), so that the products after the statistics read them there
/// rather than from memory: a LayerNorm's, where both are weights (written by no kernel),
/// aligned, and at most [`NORM_STAGED_BYTES`] each. An RMSNorm's scale stays where stored: on
/// an H200 the copies took 9 µs off GPT-2 small's step at batch 1 (its LayerNorms) but added 3
/// to the Llama-style decoder's (its RMSNorms), for reasons not yet measured
/// (`benches/NOTES.md`). `FUSEC_SKINNY_NORM_STAGED` (at compile time) `=1` copies them for
/// either norm, `=0` for neither, for measuring.
fn norm_staged(norm: Option<&Norm>, k: usize, dtype: DType) -> bool {
    let weight = |l: Location| matches!(l, Location::Weights(_)) && aligned(l);
    let wanted = |n: &Norm| match one_of("FUSEC_SKINNY_NORM_STAGED", &[0, 1]) {
        Some(on) => on == 1,
        None => !n.rms,
    };
    norm.is_some_and(|n| wanted(n) && n.gamma.is_some_and(weight) && n.beta.is_none_or(weight))
        && k * dtype.size_bytes() <= NORM_STAGED_BYTES
}

/// The norm kernel `index − 1` where the GEMM of kernel `index` (node `gemm`, spec `g`) can
/// take it in: a LayerNorm or RMSNorm over the last axis (of a stored value, or of the sum of
/// two the kernel also stores), read by this GEMM alone (as its A, through reshapes at most),
/// everything stored in the GEMM's element type, none of its memory the GEMM's output's.
pub fn norm_before(plan: &Plan, index: usize, gemm: NodeId, g: &GemmSpec) -> Option<Norm> {
    let graph = &plan.graph;
    let before = plan.kernels.get(index.checked_sub(1)?)?;
    let view = |id: NodeId| matches!(graph.node(id).op, Op::Reshape { .. } | Op::Identity);
    let through_views = |mut id: NodeId| {
        while view(id) {
            id = graph.inputs_of(id)[0];
        }
        id
    };
    let computed: Vec<NodeId> = before.nodes.iter().copied().filter(|&id| !view(id)).collect();
    let norm = *computed.last()?;
    let (axis, epsilon, rms, deviation) = match graph.node(norm).op {
        Op::LayerNorm { axis, epsilon } => (axis, epsilon, false, false),
        Op::RmsNorm { axis, epsilon, deviation } => (axis, epsilon, true, deviation),
        _ => return None,
    };
    // A is the norm's value, through views read by nothing else.
    let mut a = graph.inputs_of(gemm)[0];
    while a != norm {
        if !view(a) || graph.users_of(a).len() != 1 {
            return None;
        }
        a = graph.inputs_of(a)[0];
    }
    let only_reader = graph.users_of(norm).len() == 1 && plan.outputs.iter().all(|b| b.value != norm);
    let inputs = graph.inputs_of(norm);
    let ty = &graph.node(norm).ty;
    if !only_reader || axis + 1 != ty.shape.len() || !before.store_views.is_empty() {
        return None;
    }
    let bytes = g.dtype.size_bytes();
    let rows_of = |id: NodeId| {
        let t = &graph.node(id).ty;
        (t.dtype == g.dtype && t.len() == g.m * g.k).then_some(())
    };
    let stored_rows = |id: NodeId| {
        rows_of(id)?;
        super::gemm::resolve(plan, id).ok().filter(|(_, transposed)| !transposed).map(|(l, _)| l)
    };
    // The norm's input: stored, or the kernel's sum of two stored values (which it stores).
    let input = through_views(inputs[0]);
    let (x, sum) = match computed[..] {
        [_] => (stored_rows(inputs[0])?, None),
        [add, _] if add == input && matches!(graph.node(add).op, Op::Binary(crate::ir::BinaryOp::Add)) => {
            let terms = graph.inputs_of(add);
            let stored = before.outputs.contains(&add);
            if !before.outputs.contains(&norm)
                || before.outputs.len() != 1 + usize::from(stored)
                || terms.len() != 2
            {
                return None;
            }
            rows_of(add)?;
            let h = if stored { Some(*plan.locations.get(&add)?) } else { None };
            (stored_rows(terms[0])?, Some((stored_rows(terms[1])?, h)))
        }
        _ => return None,
    };
    if before.outputs.len() > 2 || ty.dtype != g.dtype {
        return None;
    }
    let vector = |id: NodeId| {
        let t = &graph.node(id).ty;
        graph.constant(id)?;
        let location @ Location::Weights(_) = *plan.locations.get(&id)? else { return None };
        (t.len() == g.k && t.dtype == g.dtype).then_some(location)
    };
    let gamma = match inputs.get(1) {
        Some(&g) => Some(vector(g)?),
        None => None,
    };
    let beta = match inputs.get(2) {
        Some(&b) => Some(vector(b)?),
        None => None,
    };
    // Nothing read may be written: the GEMM's output and the stored sum overlap no input.
    let (rows, out) = (g.m * g.k * bytes, g.m * g.n * bytes);
    let read: Vec<Location> = std::iter::once(x).chain(sum.map(|(y, _)| y)).collect();
    let written: Vec<(Location, usize)> =
        std::iter::once((g.c, out)).chain(sum.and_then(|(_, h)| h).map(|h| (h, rows))).collect();
    if read.iter().any(|&r| written.iter().any(|&(w, len)| overlaps(r, rows, w, len)))
        || (rms && beta.is_some())
    {
        return None;
    }
    Some(Norm { step: index - 1, x, sum, gamma, beta, epsilon, rms, deviation })
}

/// Most bytes of the next product's weights a kernel for a few rows asks L2 for (a fraction of
/// the H100's 50 MB, so that its own weights and the activations stay).
const PREFETCH_MAX: usize = 16 << 20;

/// The weights of the next product after kernel `index` (its B, stored among the weights,
/// at most [`PREFETCH_MAX`] bytes) and their size: what the kernel for a few rows of kernel
/// `index` asks L2 for while it runs. None with `FUSEC_SKINNY_PREFETCH=0` (at compile time).
pub fn next_weights(plan: &Plan, index: usize) -> Option<(Location, usize)> {
    if knobs::off("FUSEC_SKINNY_PREFETCH") {
        return None;
    }
    let graph = &plan.graph;
    let next = plan
        .kernels
        .iter()
        .skip(index + 1)
        .find(|k| matches!(k.kind, crate::fusion::KernelKind::Gemm { .. }))?;
    let b = *graph.inputs_of(*next.nodes.first()?).get(1)?;
    let (location @ Location::Weights(_), _) = super::gemm::resolve(plan, b).ok()? else { return None };
    let ty = &graph.node(b).ty;
    let bytes = ty.len() * ty.dtype.size_bytes();
    (bytes > 0 && bytes <= PREFETCH_MAX).then_some((location, bytes))
}

/// Whether `a_len` bytes at `a` and `b_len` bytes at `b` share any byte (only arena memory is
/// written, so weights overlap nothing a kernel writes).
fn overlaps(a: Location, a_len: usize, b: Location, b_len: usize) -> bool {
    match (a, b) {
        (Location::Arena(p), Location::Arena(q)) => crate::plan::ranges_meet((p, a_len), (q, b_len)),
        _ => false,
    }
}

/// Whether `location` starts on a 16-byte boundary (packs are read whole).
fn aligned(location: Location) -> bool {
    match location {
        Location::Arena(o) | Location::Weights(o) => o % 16 == 0,
    }
}

/// How a `[K, N]` operand's kernel tiles the columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiling {
    /// Four packs across a block's columns where they divide N (fewer where not).
    Wide,
    /// Half the packs of [`Tiling::Wide`], twice the blocks: a second kernel of the step for
    /// one or two rows of A, timed against the first at load (on the H200 GPT-2 small's step
    /// ran faster with it, the Llama-style decoder's slower: `benches/NOTES.md`). None where
    /// the wide tiling has one pack, for `[N, K]` operands, and on tensor cores, but for a
    /// vocabulary's product there, whose second kernel stages A in shared memory (`staged.rs`).
    Narrow,
}

/// The kernel for GEMM `g` of step `name`, where it is one: a single static product of at
/// most [`MAX_ROWS`] rows (or [`mma::MAX_ROWS`] of a half type), A read as stored, whole 16-byte packs along B's stored rows; with
/// `epilogue_kernel` (the step's fused ops run after the call), only where cuBLASLt's epilogue
/// is exactly those ops.
pub fn generate(
    g: &GemmSpec,
    (epilogue_kernel, tiling): (bool, Tiling),
    (prologue, next): (Option<Prologue<'_>>, Option<(Location, usize)>),
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<Option<KernelSource>, String> {
    let dtype = g.dtype;
    let norm = match prologue {
        Some(Prologue::Norm(norm)) => Some(norm),
        _ => None,
    };
    let gate = match prologue {
        Some(Prologue::Gate(gate)) => Some(gate),
        _ => None,
    };
    // Half types of enough rows take the tensor-core kernel.
    let tensor_cores = dtype != DType::F32 && g.m >= mma::fewest_rows();
    if g.dims.is_some()
        || g.batch != 1
        || g.m == 0
        || g.m > mma::MAX_ROWS
        || (g.m > MAX_ROWS && !tensor_cores)
        || g.a.transposed
        || !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        || (epilogue_kernel && g.lt_epilogue.is_none())
    {
        return Ok(None);
    }
    let lanes = 16 / dtype.size_bytes();
    let rows = g.b.transposed;
    let narrower = tiling == Tiling::Narrow;
    // A vocabulary's second kernel on tensor cores: A staged in shared memory (`staged.rs`).
    let staged = narrower && tensor_cores && rows && prologue.is_none();
    if narrower && !staged && (rows || g.m > 2 || tensor_cores || knobs::off("FUSEC_SKINNY_TILINGS")) {
        return Ok(None);
    }
    let alpha = g.alpha * g.lt_epilogue.map_or(1.0, |e| e.scale());
    // A as the kernel reads it: the norm's input (and the sum's second term) where it takes
    // the norm in, the gate's two factors where it takes the gate in (rows `a_stride` apart).
    let a = gate.map_or(norm.map_or(g.a.location, |n| n.x), |gate| gate.x);
    let term = gate.map(|gate| gate.y).or(norm.and_then(|n| n.sum).map(|(y, _)| y));
    let a_stride = gate.map_or(g.k, |gate| gate.stride);
    if g.k % lanes != 0
        || (!rows && g.n % lanes != 0)
        || !alpha.is_finite()
        || a_stride % lanes != 0
        || ![a, g.b.location].into_iter().chain(term).all(aligned)
        || (tensor_cores && gate.is_some())
        || (gate.is_some() && g.m * g.k > GATE_FLOATS)
    {
        return Ok(None);
    }
    let t = c_type(dtype)?;
    // C's type: f32 where the product is stored widened (`GemmSpec::out`).
    let out_t = c_type(g.c_dtype())?;
    let (m, n, k) = (g.m, g.n, g.k);
    let epilogue = g.lt_epilogue;
    let (bias, residual) = (epilogue.and_then(|e| e.bias), epilogue.and_then(|e| e.residual));
    // A weight is written by no kernel: the kernel may read it before its wait.
    let bias_early = matches!(bias, Some(Location::Weights(_)));
    let mut params = vec![
        format!("const {t}* __restrict__ a_in"),
        format!("const {t}* __restrict__ b_in"),
        // Not restricted: the residual may be read from the output's own memory.
        format!("{out_t}* c_out"),
    ];
    let mut args = vec![a, g.b.location, g.c];
    if let Some(b) = bias {
        params.push(format!("const {t}* __restrict__ bias"));
        args.push(b);
    }
    if let Some(r) = residual {
        params.push(format!("const {t}* residual"));
        args.push(r);
    }
    if let Some(norm) = norm {
        if let Some(gamma) = norm.gamma {
            params.push(format!("const {t}* __restrict__ gamma"));
            args.push(gamma);
        }
        if let Some(beta) = norm.beta {
            params.push(format!("const {t}* __restrict__ beta"));
            args.push(beta);
        }
        if let Some((y, h)) = norm.sum {
            params.push(format!("const {t}* __restrict__ a_term"));
            args.push(y);
            if let Some(h) = h {
                params.push(format!("{t}* __restrict__ h_out"));
                args.push(h);
            }
        }
    }
    if let Some(gate) = gate {
        params.push(format!("const {t}* __restrict__ a_term"));
        args.push(gate.y);
    }
    if let Some((b, _)) = next {
        params.push("const void* __restrict__ next_b".to_string());
        args.push(b);
    }
    let summed = norm.is_some_and(|n| n.sum.is_some());
    // A's element as stored (the sum of two, where the norm is of a sum). The gate's A is
    // computed by the block into shared memory (`gates` in the template).
    let element = |first: &str, second: &str| match summed {
        true => format!("({} + {})", load(first, dtype), load(second, dtype)),
        false => load(first, dtype),
    };
    let activation = match epilogue.map(|e| e.activation) {
        Some(LtActivation::Relu) => "fusec::relu(r)",
        Some(LtActivation::GeluTanh) => "fusec::gelu_tanh(r)",
        None | Some(LtActivation::None) => "r",
    };
    let describe = match epilogue {
        Some(e) => format!("the product ({})", e.describe()),
        None => "the product".to_string(),
    } + if gate.is_some() { " (A = x·σ(x)·y, x and y read where stored)" } else { "" };
    let name = match (staged, narrower) {
        (true, _) => format!("{name}_skinny_staged"),
        (false, true) => format!("{name}_skinny_narrow"),
        (false, false) => format!("{name}_skinny"),
    };
    // What both kernels take: the product, its epilogue, the next product's weights.
    let mut data = json!({
        "name": name,
        "headers": header(dtype).into_iter().collect::<Vec<_>>(),
        "describe": describe,
        "t": t,
        "out_t": out_t,
        "m": m,
        "n": n,
        "k": k,
        "rows": rows,
        "alpha": format!("{alpha:?}f"),
        "bias": bias.is_some(),
        "residual": residual.is_some(),
        // The epilogue's operands read before the sums are made: the bias before the wait
        // where it is a weight, the residual (and a bias that is not) just after it.
        "epilogue_loads": bias.is_some() || residual.is_some(),
        "bias_early": bias_early,
        "epilogue_late": residual.is_some() || (bias.is_some() && !bias_early),
        "bias_arg": if bias.is_some() { "bias" } else { "nullptr" },
        "residual_arg": if residual.is_some() { "residual" } else { "nullptr" },
        "load_bias": load("bias[c]", dtype),
        "load_residual": load(&format!("residual[m * {n}LL + c]"), dtype),
        "activation": activation,
        "store": narrow("r", g.c_dtype()),
        "prefetch": next.map(|(_, bytes)| bytes),
        "params": params.join(", "),
        "norm": norm.is_some(),
        "rms": norm.is_some_and(|n| n.rms && !n.deviation),
        "deviation": norm.is_some_and(|n| n.deviation),
        "gamma": norm.is_some_and(|n| n.gamma.is_some()),
        "beta": norm.is_some_and(|n| n.beta.is_some()),
        // A second operand read beside A: the sum's second term, or the gate's second factor.
        "summed": summed || gate.is_some(),
        "a_stride": a_stride,
        "store_sum": norm.and_then(|n| n.sum).is_some_and(|(_, h)| h.is_some()),
        "epsilon": format!("{:?}f", norm.map_or(0.0, |n| n.epsilon)),
    });
    if staged {
        return staged::generate(g, data, hb).map(|launch| {
            launch.map(|(source, grid, block)| KernelSource::new(&name, source, grid, block, args))
        });
    }
    if tensor_cores {
        // The tensor-core kernel leaves the norm to its own kernel but where it takes it in
        // ([`mma::takes_norm`]). Its scale and shift are read in packs.
        if norm
            .is_some_and(|n| !mma::takes_norm(n, m, rows) || !n.gamma.into_iter().chain(n.beta).all(aligned))
        {
            return Ok(None);
        }
        return mma::generate(g, data, hb).map(|launch| {
            launch.map(|(source, grid, block)| KernelSource::new(&name, source, grid, block, args))
        });
    }
    // [N, K]: columns a warp (more where A's rows are many: each pack of A serves them all).
    // A vocabulary's projection (tens of thousands of columns) at one or two rows: eight
    // columns a warp and eight warps a block, its 77 MB (GPT-2 small) in 23.8 µs on an H200
    // where one column a warp took 66 µs and cuBLAS 28.5 (`benches/NOTES.md`).
    // `FUSEC_SKINNY_PER_WARP` (1, 2, 4 or 8) and `FUSEC_SKINNY_BLOCK_WARPS` (4, 8 or 16)
    // override both, for measuring them.
    let vocabulary = rows && m <= 2 && n >= WIDE;
    let per_warp = one_of("FUSEC_SKINNY_PER_WARP", &[1, 2, 4, 8]).unwrap_or(match m {
        _ if vocabulary => 8,
        1..=2 => 1,
        3..=4 => 2,
        _ => 4,
    });
    let rows_warps =
        one_of("FUSEC_SKINNY_BLOCK_WARPS", &[4, 8, 16]).unwrap_or(if vocabulary { 8 } else { ROWS_WARPS });
    // [K, N]: four packs across a block's columns where they divide N (on the H100 faster than
    // one or two packs, which give more, thinner blocks, and than eight: `benches/NOTES.md`).
    // `FUSEC_SKINNY_COLS` (1, 2, 4 or 8 packs) and `FUSEC_SKINNY_THREADS` (128, 256, 512)
    // override both, for measuring them.
    let forced_cols = one_of("FUSEC_SKINNY_COLS", &[1, 2, 4, 8]).filter(|c| n % (c * lanes) == 0);
    let wide = forced_cols
        .unwrap_or_else(|| [4usize, 2, 1].into_iter().find(|&cl| n % (cl * lanes) == 0).unwrap_or(1));
    if narrower && wide < 2 {
        return Ok(None);
    }
    let col_lanes = if narrower { wide / 2 } else { wide };
    let cols = col_lanes * lanes;
    let threads = one_of("FUSEC_SKINNY_THREADS", &[128, 256, 512]).unwrap_or(COLS_BLOCK);
    let (block, grid, iterations) = if rows {
        let packs = k / lanes;
        (rows_warps * 32, n.div_ceil(rows_warps * per_warp), packs.div_ceil(32))
    } else {
        let k_lanes = threads / col_lanes;
        (threads, n / cols, k.div_ceil(k_lanes))
    };
    // A wide product's blocks come in waves (GPT-2's vocabulary: 786 blocks over 132
    // multiprocessors; a [K, N] one of 32,000 columns over 1,024 rows: 1,000): two blocks a
    // multiprocessor (ptxas then keeps a thread to 128 registers, no spills, where one block
    // took 202 and 201 with the norm taken in), so that one block's start overlaps another's
    // reads. `FUSEC_SKINNY_TWO_BLOCKS=0` keeps one.
    let two = m <= 2 && n >= WIDE && !knobs::off("FUSEC_SKINNY_TWO_BLOCKS");
    let min_blocks = if two { 2 } else { 1 };
    let staged = norm_staged(norm, k, dtype);
    let per_thread = k.div_ceil(block);
    // Outputs a lane (`[N, K]`: a warp's m × per_warp over its 32 lanes) or a thread (`[K, N]`:
    // a block's m × cols over its threads) stores, whose epilogue operands it holds.
    let outs = if rows { (m * per_warp).div_ceil(32) } else { (m * cols).div_ceil(block) };
    let gate_per_thread = (m * (k / lanes)).div_ceil(block);
    let fields = json!({
        "lanes": lanes,
        "block": block,
        "min_blocks": min_blocks,
        "warps": block / 32,
        "per_warp": per_warp,
        "packs": k / lanes,
        "iterations": iterations,
        // Packs loaded before they are summed (4 registers each): up to 16 a thread for one
        // or two rows of A, else 8.
        "chunk": if rows { 8 / per_warp } else { iterations.min(if m <= 2 { 16 } else { 8 }) },
        // The last iteration past the end for some threads.
        "ragged": if rows { (k / lanes) % 32 != 0 } else { k % (block / col_lanes) != 0 },
        "cols": cols,
        "col_lanes": col_lanes,
        "k_lanes": block / col_lanes,
        // The gate's A read from shared memory, where the block computed it (`gates`).
        "load_a": match gate {
            Some(_) => "ga[v]".to_string(),
            None => norm_expr(
                element("a.v[v]", "a2.v[v]"),
                &format!("p * {lanes} + v"),
                norm,
                dtype,
                staged.then_some(("gp.v[v]", "bp.v[v]")),
            ),
        },
        "load_a_scalar": match gate {
            Some(_) => "gs[m][k]".to_string(),
            None => norm_expr(
                element(&format!("a_in[m * {a_stride}LL + k]"), &format!("a_term[m * {a_stride}LL + k]")),
                "k",
                norm,
                dtype,
                staged.then_some(("ng[k]", "nb[k]")),
            ),
        },
        "gate": gate.is_some(),
        "gate_x": load("a[j].v[v]", dtype),
        "gate_y": load("a2[j].v[v]", dtype),
        "norm_staged": staged,
        "outs": outs,
        // The norm's and the gate's loads a thread (`statistics`, `gates`), in groups whose
        // loads are all in flight before the first is used.
        "per_thread": per_thread,
        "group": per_thread.min((LOADS_AT_ONCE / m).max(1)),
        "gate_per_thread": gate_per_thread,
        "gate_group": gate_per_thread.clamp(1, LOADS_AT_ONCE / 8),
        "load_b": load(if rows { "b[j][c].v[v]" } else { "b[j].v[v]" }, dtype),
        "load_x": element(&format!("a_in[m * {k}LL + i]"), &format!("a_term[m * {k}LL + i]")),
        "store_h": narrow("x", dtype),
    });
    extend(&mut data, fields);
    let source = render(hb, "skinny_gemm", &data)?;
    Ok(Some(KernelSource::new(&name, source, grid as u32, block as u32, args)))
}

/// `data` (an object) with `fields`' entries added.
fn extend(data: &mut serde_json::Value, fields: serde_json::Value) {
    if let (Some(data), serde_json::Value::Object(fields)) = (data.as_object_mut(), fields) {
        data.extend(fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::{GemmDims, GemmOperand};
    use crate::ir::SymDim;

    fn spec(m: usize, n: usize, k: usize, b_transposed: bool) -> GemmSpec {
        let operand = |offset, transposed| GemmOperand {
            location: Location::Weights(offset),
            transposed,
            batch_stride: 0,
        };
        GemmSpec {
            a: GemmOperand { location: Location::Arena(0), transposed: false, batch_stride: 0 },
            b: operand(256, b_transposed),
            c: Location::Arena(4096),
            m,
            n,
            k,
            batch: 1,
            alpha: 1.0,
            dtype: DType::F16,
            out: None,
            lt_epilogue: None,
            dims: None,
        }
    }

    #[test]
    fn launch_shapes_and_what_is_left_to_the_library() {
        let hb = super::super::templates().unwrap();
        let make = |g: &GemmSpec| generate(g, (false, Tiling::Wide), (None, None), "k", &hb).unwrap();
        // [K, N]: columns in tiles of four packs (32 in f16): 2304 in 72 blocks, 768 in 24; 776
        // (97 packs) one pack a block.
        assert_eq!(make(&spec(1, 2304, 768, false)).unwrap().grid, 72);
        assert_eq!(make(&spec(1, 768, 3072, false)).unwrap().grid, 24);
        assert_eq!(make(&spec(1, 776, 768, false)).unwrap().grid, 97);
        // [N, K]: a warp a column at one row, four columns a warp at eight (f32: in half
        // types eight rows take the tensor-core kernel); a vocabulary at one row eight columns
        // a warp, eight warps a block, at three rows two a warp.
        assert_eq!(make(&spec(1, 4096, 768, true)).unwrap().grid, 4096usize.div_ceil(4) as u32);
        let vocabulary = make(&spec(1, 50257, 768, true)).unwrap();
        assert_eq!((vocabulary.grid, vocabulary.block), (50257usize.div_ceil(64) as u32, 256));
        // Its blocks in waves: two a multiprocessor; three rows' (not wide) one.
        assert!(vocabulary.source.contains("__launch_bounds__(256, 2)"));
        let three = make(&spec(3, 50257, 768, true)).unwrap();
        assert_eq!(three.grid, 50257usize.div_ceil(8) as u32);
        assert!(three.source.contains("__launch_bounds__(128, 1)"));
        // [K, N] as wide: two too.
        assert!(make(&spec(1, 32000, 1024, false)).unwrap().source.contains("__launch_bounds__(256, 2)"));
        let mut g = spec(8, 1000, 64, true);
        g.dtype = DType::F32;
        assert_eq!(make(&g).unwrap().grid, 1000usize.div_ceil(16) as u32);
        // Nine rows in f16: the tensor-core kernel; in f32, a ragged K or N, a misaligned
        // operand, a range of sizes: none.
        let mma = make(&spec(9, 2304, 768, false)).unwrap();
        assert!(mma.source.contains("mma_m16n8k16") && mma.source.contains("__byte_perm"), "{}", mma.source);
        let mut g = spec(9, 2304, 768, false);
        g.dtype = DType::F32;
        assert!(make(&g).is_none());
        assert!(make(&spec(65, 2304, 768, false)).is_none());
        assert!(make(&spec(1, 2304, 766, true)).is_none());
        assert!(make(&spec(1, 2300, 768, false)).is_none());
        let mut g = spec(1, 2304, 768, false);
        g.b.location = Location::Weights(8);
        assert!(make(&g).is_none());
        let one = SymDim::lit(1);
        let mut g = spec(1, 2304, 768, false);
        g.dims = Some(Box::new(GemmDims {
            m: one.clone(),
            n: SymDim::lit(2304),
            k: SymDim::lit(768),
            batch: one,
            a_stride: SymDim::lit(0),
            b_stride: SymDim::lit(0),
        }));
        assert!(make(&g).is_none());
        // Narrow tiles: half the packs across a [K, N] block's columns, twice the blocks, for
        // one or two rows; none for [N, K], more rows, or where the wide tiling has one pack.
        let narrow = |g: &GemmSpec| generate(g, (false, Tiling::Narrow), (None, None), "k", &hb).unwrap();
        let two = narrow(&spec(1, 2304, 768, false)).unwrap();
        assert_eq!((two.grid, two.function.ends_with("_skinny_narrow")), (144, true));
        assert_eq!(narrow(&spec(2, 768, 3072, false)).unwrap().grid, 48);
        assert!(narrow(&spec(1, 4096, 768, true)).is_none());
        assert!(narrow(&spec(3, 2304, 768, false)).is_none());
        assert!(narrow(&spec(1, 776, 768, false)).is_none());
        // A fused epilogue cuBLASLt cannot run stays with the library's call and its kernel.
        assert!(generate(&spec(1, 2304, 768, false), (true, Tiling::Wide), (None, None), "k", &hb)
            .unwrap()
            .is_none());
    }
}
