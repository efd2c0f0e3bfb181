//! The kernel for tens of rows of A (a decoding step of a batch of sequences) in a half type:
//! the CUDA-core kernel's sums grow with the rows (and lost to cuBLASLt from eight rows on),
//! so here the products run on tensor cores (`templates/skinny_mma.cu.hbs`), B still read
//! once, straight into mma fragments, spread down K over enough warps (a cluster's blocks
//! where one block's warps are too few) to keep every multiprocessor reading.

use handlebars::Handlebars;
use serde_json::{json, Value};

use super::super::gemm::GemmSpec;
use super::super::kernel::render;
use super::{extend, Norm};
use crate::knobs::{number, on, one_of};

/// The most rows of A the tensor-core kernel takes (in tiles of 8, its sums in registers).
pub const MAX_ROWS: usize = 64;

/// Warps reading B, over the grid, that keep the H100's 132 multiprocessors busy (eight each).
const WARPS_WANTED: usize = 132 * 8;

/// Warps wanted where A has four tiles of rows or more (25 to 64 rows): fewer splits of K, so
/// fewer partial sums to add. GPT-2 small's step at 32 rows on the H200 took 0.444 ms a token
/// with [`WARPS_WANTED`], 0.437 with this and 0.49 with 132; at 8 rows this was 14 µs slower
/// (`benches/NOTES.md`, thirty-sixth session).
const WARPS_WANTED_MANY_ROWS: usize = 132 * 2;

/// The fewest tiles of 8 rows that take [`WARPS_WANTED_MANY_ROWS`].
const MANY_ROW_TILES: usize = 4;

/// Most warps a block (more split K through a cluster's blocks).
const MAX_WARPS: usize = 4;

/// Most blocks a cluster (the portable limit).
const MAX_CLUSTER: usize = 8;

/// Chunks of K a warp has in flight at once where B is stored `[N, K]`: GPT-2 small's
/// vocabulary at 32 rows on the H200 took 43.1 µs with 4, 33.9 with 6, 46.1 with 8 (202
/// registers) (`benches/NOTES.md`). `FUSEC_SKINNY_MMA_UNROLL` (1 to 8) overrides it, and
/// `FUSEC_SKINNY_MMA_NARROW=1` takes tiles of 16 columns where they would be 32, for measuring them.
const ROWS_UNROLL: usize = 6;

/// The fewest rows that take the tensor-core kernel by default: GPT-2 small's step on the H200
/// was as fast with either kernel at 4 rows, faster with this one at 8, slower at 2
/// (`benches/NOTES.md`).
const FEWEST_ROWS: usize = 5;

/// The fewest rows that take the tensor-core kernel ([`FEWEST_ROWS`]; fewer go to the
/// CUDA-core kernel); `FUSEC_SKINNY_MMA` sets it at compile time (`0`: never, the CUDA-core
/// kernel up to its [`super::MAX_ROWS`]), for measuring the two kernels at the same rows.
pub fn fewest_rows() -> usize {
    match number("FUSEC_SKINNY_MMA") {
        Some(0) => usize::MAX,
        Some(rows) => rows.max(1),
        None => FEWEST_ROWS,
    }
}

/// The launch of the product: `(tile columns, warps a block, blocks a cluster, chunks of K)`
/// for `m` rows, `n` columns, `k` deep, B stored `[N, K]` where `rows`. None where K is not
/// whole chunks of 32. `FUSEC_SKINNY_WARPS` (the warps wanted over the grid) overrides
/// [`WARPS_WANTED`] and [`WARPS_WANTED_MANY_ROWS`], for measuring them.
pub fn shape(m: usize, n: usize, k: usize, rows: bool) -> Option<(usize, usize, usize, usize)> {
    if k % 32 != 0 || m == 0 || m > MAX_ROWS || (!rows && n % 4 != 0) {
        return None;
    }
    let m_tiles = m.div_ceil(8);
    // Columns a warp: two mma tiles of 16 (one where A's tiles are many); for B [K, N], a
    // lane's pack of 8 or 4 consecutive columns is 4 or 2 tiles.
    let narrow = on("FUSEC_SKINNY_MMA_NARROW");
    let cols = match rows {
        true if m_tiles <= 4 && !narrow => 32,
        true => 16,
        false if m_tiles <= 4 && n % 8 == 0 => 64,
        false => 32,
    };
    let chunks = k / 32;
    let default = if m_tiles >= MANY_ROW_TILES { WARPS_WANTED_MANY_ROWS } else { WARPS_WANTED };
    let wanted = number("FUSEC_SKINNY_WARPS").filter(|&w| w > 0).unwrap_or(default);
    // Splits of K: enough warps over the grid, at least two chunks a warp.
    let mut splits = wanted.div_ceil(n.div_ceil(cols)).clamp(1, (chunks / 2).max(1));
    if one_trip(rows, cols) {
        splits = splits.max(chunks.div_ceil(3).min(MAX_WARPS * MAX_CLUSTER));
    }
    let warps = splits.min(MAX_WARPS);
    let mut cluster = splits.div_ceil(warps).min(MAX_CLUSTER);
    while cluster > 1 && warps * cluster > chunks {
        cluster -= 1;
    }
    Some((cols, warps, cluster, chunks))
}

/// Whether a `[K, N]` product in tiles of 64 columns splits K into at least a third as many
/// parts as it has chunks (up to [`MAX_WARPS`] × [`MAX_CLUSTER`]), so that every warp's
/// weights (three chunks at most, [`generate`]'s unroll) are requested in one trip, before
/// the kernel's wait: with fewer splits a warp's chunks after its first three or two are read
/// after the wait, a trip to memory on the step's chain (GPT-2 small's MLP-down at 32 rows,
/// 96 chunks in 24 splits: two trips; in 32: one). `FUSEC_SKINNY_ONE_TRIP=0` leaves the
/// splits as the warps wanted make them, for measuring it.
fn one_trip(rows: bool, cols: usize) -> bool {
    !rows && cols == 64 && !crate::knobs::off("FUSEC_SKINNY_ONE_TRIP")
}

/// Whether the tensor-core kernel takes in the norm before its product: folded where
/// [`folds_norm`] says (by default an RMSNorm at up to 24 rows before `[K, N]` weights), else
/// as read (each block computing every row's statistics before its first product, as the
/// CUDA-core kernel does): for an RMSNorm at one tile of rows (eight at most), where the
/// Llama-style decoder's step at 8 rows on the H200 took 0.268–0.270 ms a token as read against
/// 0.277 apart (and 0.241–0.242 folded); GPT-2 small's LayerNorms at 8
/// and 32 rows and the Llama-style decoder at 32 were slower with it (`benches/NOTES.md`,
/// thirty-sixth session). `FUSEC_SKINNY_MMA_NORM=1` takes every norm in, `=2` those before
/// weights stored `[K, N]` only (not a vocabulary's, `rows`, whose one-warp blocks would each
/// take every row's statistics), `=0` none, for measuring it. With `=2` GPT-2 small's step took
/// 0.439–0.441 ms a token at 32 rows against 0.411–0.412 apart, 0.294 at 8 rows against 0.269,
/// and no faster with A staged in shared memory once a block (forty-first session).
pub fn takes_norm(norm: &Norm, m: usize, rows: bool) -> bool {
    let rms = norm.rms && !norm.deviation;
    if folds(rms, norm.deviation, norm.gamma.is_some(), m, rows) {
        return true;
    }
    match one_of("FUSEC_SKINNY_MMA_NORM", &[0, 1, 2]) {
        Some(0) => false,
        Some(2) => !rows,
        Some(_) => true,
        None => rms && m <= 8,
    }
}

/// Whether the tensor-core kernel takes the norm before a product with weights stored `[K, N]`
/// in folded: A's rows scaled by the norm's scale and multiplied as read, each row's statistics
/// summed from the same loads (no pass over A before the products), and taken out after the
/// sums, with the products of the scale (and the shift) computed as rows of A of their own:
/// `norm(x)·B = rstd·(x·γ·B − mean·(γ·B)) + β·B`. By default for an RMSNorm at up to
/// [`FOLD_ROWS`] rows, where the packs of A and of the sum's second term still come in groups:
/// the Llama-style decoder's step on the H200 took, folded against the norm as before, 0.240–0.242
/// ms a token against 0.262–0.263 at 8 rows (its statistics taken first), 0.269–0.270 against
/// 0.281–0.282 at 16 and 0.294–0.295 against 0.299–0.307 at 24 (the norm's own kernel), but
/// 0.344 against 0.330 at 32 (A chunk by chunk); GPT-2 small's LayerNorms folded were even or
/// slower (0.268 against 0.267 at 8 rows, 0.354 against 0.340 at 16, 0.439–0.440 against
/// 0.411–0.412 at 32) (`benches/NOTES.md`, forty-second session). `FUSEC_SKINNY_MMA_FOLD=1`
/// folds every norm before `[K, N]` weights, `=0` none (at compile time), for measuring it.
/// A norm without a scale (`scaled` false: its scale folded into the weights by
/// `passes::FoldNormScales`, and a LayerNorm's mean with it) is folded at any rows: it needs
/// no rows of A of its own and no scale read beside A.
pub fn folds_norm(rms: bool, scaled: bool, m: usize, rows: bool) -> bool {
    !rows
        && match one_of("FUSEC_SKINNY_MMA_FOLD", &[0, 1]) {
            Some(on) => on == 1,
            None => !scaled || (rms && m <= FOLD_ROWS),
        }
}

/// Whether the tensor-core kernel folds in a norm of these statistics (`rms`: an RMSNorm's;
/// `deviation`: a LayerNorm's, no mean taken out of x; else a LayerNorm's) and scale
/// ([`folds_norm`]). A LayerNorm's mean is taken out through the products of its scale, so one
/// without a scale is not folded.
fn folds(rms: bool, deviation: bool, gamma: bool, m: usize, rows: bool) -> bool {
    let centred = !rms && !deviation;
    (gamma || !centred) && folds_norm(rms, gamma || centred, m, rows)
}

/// The most rows at which an RMSNorm is folded into the tensor-core product by default
/// ([`folds_norm`]).
const FOLD_ROWS: usize = 24;

/// Whether a thread of the tensor-core kernel reads the bias and residual of the outputs it
/// stores (at most four of them) before its sums are made — a bias that is a weight at the
/// kernel's start, the rest right after its wait — rather than as it stores each, after the
/// warps' and the cluster's sums: for one tile of rows (eight at most), where GPT-2 small's step
/// at 8 rows took 15 µs less that way on the H200 and at 32 rows 3–5 µs more (`benches/NOTES.md`,
/// thirty-sixth session). `FUSEC_SKINNY_MMA_EPILOGUE=1` reads them early at any rows, `=0`
/// never, for measuring it.
pub fn epilogue_early(m_tiles: usize) -> bool {
    match one_of("FUSEC_SKINNY_MMA_EPILOGUE", &[0, 1]) {
        Some(0) => false,
        Some(_) => true,
        None => m_tiles == 1,
    }
}

/// Whether a thread of the tensor-core kernel requests the bias and residual of its outputs
/// (up to [`EPILOGUE_GROUP`] of them, or all that a cluster's block stores) at once, before it
/// stores any, where [`epilogue_early`] has not read them already. The residual may be read
/// from the output's own memory (it is not `__restrict__`), so neither compiler moves a load of
/// it above an earlier output's store: output by output, each is a trip to L2 on the kernel's
/// last stretch (GPT-2 small's out-projection at 32 rows: six a thread).
/// Reading them all first is safe even in place: a thread reads the residual only at the
/// outputs it stores itself. `FUSEC_SKINNY_MMA_EPILOGUE_AT_ONCE=0` reads each as its output is
/// stored, for measuring it.
fn epilogue_at_once() -> bool {
    !crate::knobs::off("FUSEC_SKINNY_MMA_EPILOGUE_AT_ONCE")
}

/// Outputs whose epilogue operands a thread requests at once ([`epilogue_at_once`]) where a
/// block stores its tile alone.
const EPILOGUE_GROUP: usize = 8;

/// The most 16-byte packs of A a thread holds at once where chunks have their A requested
/// together ([`a_group`]): 48 registers.
const A_AT_ONCE_PACKS: usize = 12;

/// How many chunks' packs of A a warp requests at once (0: each chunk's right before its
/// products). Each chunk's alone is a dependent trip to L2 a chunk after the wait: neither
/// compiler moves a later chunk's loads above an earlier chunk's products (with the `mma`'s
/// assembly `volatile` or not: the same PTX and SASS, forty-first session). So the chunks of a
/// trip are taken in groups of as many as [`A_AT_ONCE_PACKS`] allow (all of a trip for GPT-2's
/// `[K, N]` products at 5 to 32 rows; the vocabulary's six a trip in two groups of three at 32
/// rows), where no norm is taken in as read (its packs are normalised as they come); a folded
/// norm's ([`folds_norm`]) with the packs of the sum's second term (`terms`: 2) and the scale's
/// and shift's. GPT-2 small at 32 rows on the H200 took 0.420–0.421 ms a token with whole trips
/// at once against 0.424–0.426 chunk by chunk, at 8 rows 0.269–0.271 against 0.278–0.280; the
/// vocabulary's in two groups added 0.4 % to batch 32's tokens/s though ptxas then gives it 248
/// registers, not 168 (`benches/NOTES.md`, fortieth session).
/// `FUSEC_SKINNY_MMA_A_AT_ONCE=0` takes them chunk by chunk, `=1` only whole trips of at most
/// [`A_AT_ONCE_PACKS`], for measuring it.
fn a_group(unroll: usize, m_tiles: usize, (norm_read, terms): (bool, usize)) -> usize {
    let group = (A_AT_ONCE_PACKS / (m_tiles * terms)).min(unroll);
    match one_of("FUSEC_SKINNY_MMA_A_AT_ONCE", &[0, 1]) {
        _ if norm_read => 0,
        Some(0) => 0,
        Some(_) if group < unroll => 0,
        _ if group <= 1 => 0,
        _ => group,
    }
}

/// Floats between rows of a warp's sums in shared memory: a tile's width, padded so that the
/// lanes' stores of one accumulator fall in distinct banks (B `[N, K]`: column `16t + r (+ 8)`,
/// row `2q (+ 1)`, so rows 4 banks apart put the 8 r beside the 4 q) or at most two to a bank (B
/// `[K, N]`: column `pack·r + …`, every bank a multiple of the pack apart, which no row stride
/// separates fully).
fn row_stride(cols: usize, rows: bool) -> usize {
    if rows {
        cols + 4
    } else {
        cols + 1
    }
}

/// The tensor-core kernel's source and launch `(source, grid, block)` for `g`, whose common
/// template data (`data`: the product, its epilogue, parameters) the caller made; None where
/// [`shape`] gives none.
pub fn generate(
    g: &GemmSpec,
    mut data: Value,
    hb: &Handlebars<'_>,
) -> Result<Option<(String, u32, u32)>, String> {
    let rows = g.b.transposed;
    let Some((cols, warps, cluster, chunks)) = shape(g.m, g.n, g.k, rows) else { return Ok(None) };
    // A norm taken in folded ([`folds_norm`]): rows of A for the scale's products (where the
    // mean is taken out) and the shift's, after A's own.
    // (An RMSNorm of the deviations has a LayerNorm's statistics and no mean to take out.)
    let norm = data["norm"] == true;
    let (rms, beta, gamma) = (data["rms"] == true, data["beta"] == true, data["gamma"] == true);
    let deviation = data["deviation"] == true;
    let centred = !rms && !deviation;
    let folded = norm && folds(rms, deviation, gamma, g.m, rows);
    let g_row = (folded && centred).then_some(g.m);
    let b_row = (folded && beta).then_some(g.m + usize::from(centred));
    let m_all = g.m + usize::from(g_row.is_some()) + usize::from(b_row.is_some());
    let m_tiles = m_all.div_ceil(8);
    // B [K, N]: a lane's columns are one pack (8 or 4 elements); two chunks of eight packs in
    // flight, or four of four; B [N, K]: six chunks of two 16-byte packs a tile.
    let pack = cols / 8;
    // (Three chunks of eight packs where that is all a warp has: one trip to memory.)
    let per_warp = chunks.div_ceil(warps * cluster);
    let (tiles, unroll) = match rows {
        true => {
            (cols / 16, one_of("FUSEC_SKINNY_MMA_UNROLL", &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap_or(ROWS_UNROLL))
        }
        false if pack == 8 => (pack / 2, if per_warp == 3 { 3 } else { 2 }),
        false => (pack / 2, 4),
    };
    let block = warps * 32;
    let grid = g.n.div_ceil(cols) * cluster;
    // The epilogue's operands read before the sums ([`epilogue_early`]), each where the
    // caller's data places it for the CUDA-core kernel too.
    let early = data["epilogue_loads"] == true && epilogue_early(g.m.div_ceil(8));
    let at_start = early && data["bias_early"] == true;
    let after_wait = early && data["epilogue_late"] == true;
    let at_once = data["epilogue_loads"] == true && epilogue_at_once();
    // A folded norm's loads come in groups too (a sum's two terms: half as many chunks).
    let terms = if folded && data["summed"] == true { 2 } else { 1 };
    let a_group = a_group(unroll, m_tiles, (norm && !folded, terms));
    extend(
        &mut data,
        json!({
            "block": block,
            "warps": warps,
            "cluster": (cluster > 1).then_some(cluster),
            "splits": warps * cluster,
            "chunks": chunks,
            "cols": cols,
            "tiles": tiles,
            "m_tiles": m_tiles,
            "m_pad": 8 * m_tiles,
            "unroll": unroll,
            "pack": pack,
            "pack_type": if pack == 8 { "uint4" } else { "uint2" },
            "rows_per_warp": g.m.div_ceil(warps),
            "many_warps": warps > 1,
            "row_stride": row_stride(cols, rows),
            "epilogue_early": early,
            "epilogue_at_start": at_start,
            "epilogue_after_wait": after_wait,
            "epilogue_at_once": at_once,
            "epilogue_group": EPILOGUE_GROUP,
            "a_group": (a_group > 0).then_some(a_group),
            "norm_read": norm && !folded,
            "folded": folded,
            "folded_group": folded && a_group > 0,
            // A one-warp block with a norm folded in, its launch bounds saying one block a
            // multiprocessor (said for every folded kernel, the Llama-style decoder's step at
            // 8 rows took 0.262 ms a token rather than 0.240–0.242: `benches/NOTES.md`).
            "one_block": folded && warps == 1,
            "g_row": g_row,
            "b_row": b_row,
            "m_all": m_all,
        }),
    );
    let source = render(hb, "skinny_mma", &data)?;
    Ok(Some((source, grid as u32, block as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trips_packs_of_a_are_requested_in_groups_of_at_most_twelve() {
        if std::env::var_os("FUSEC_SKINNY_MMA_A_AT_ONCE").is_some() {
            return;
        }
        // GPT-2's [K, N] products at 32 rows: three chunks a trip, four tiles of rows.
        assert_eq!(a_group(3, 4, (false, 1)), 3);
        // Its vocabulary at 32 rows (six chunks a trip): two groups of three; at 8 rows one of six.
        assert_eq!(a_group(6, 4, (false, 1)), 3);
        assert_eq!(a_group(6, 1, (false, 1)), 6);
        // A folded norm's sum at 8 rows: two terms, three chunks at once; at 32 (five tiles with
        // the scale's and shift's rows), one: chunk by chunk.
        assert_eq!(a_group(3, 1, (false, 2)), 3);
        assert_eq!(a_group(3, 5, (false, 2)), 0);
        // A norm taken in as read, or one chunk a group: chunk by chunk.
        assert_eq!(a_group(3, 1, (true, 1)), 0);
        assert_eq!(a_group(4, 8, (false, 1)), 0);
    }

    #[test]
    fn warps_split_k_until_the_grid_is_full() {
        // GPT-2 small at 8 rows: the QKV product ([K, N] 768 × 2304) in 36 tiles of 64
        // columns, 24 chunks of K over 4 warps and a cluster of 3 (two chunks a warp); the
        // MLP's second (3072 deep, 768 wide) over 12 tiles, 96 chunks over 4 warps × 8 blocks.
        // At 32 rows fewer warps are wanted: clusters of 2 for the QKV product, and for the
        // MLP's second the 32 splits that keep a warp's weights one trip (three chunks; 24 as
        // wanted would read two). The vocabulary ([N, K], 50,257 columns) in tiles of 32, one
        // warp each.
        std::env::remove_var("FUSEC_SKINNY_WARPS");
        assert_eq!(shape(8, 2304, 768, false), Some((64, 4, 3, 24)));
        assert_eq!(shape(8, 768, 3072, false), Some((64, 4, 8, 96)));
        assert_eq!(shape(32, 2304, 768, false), Some((64, 4, 2, 24)));
        assert_eq!(shape(32, 768, 3072, false), Some((64, 4, 8, 96)));
        // The Llama-style decoder's at 32 rows (2,816 deep, 88 chunks): 32 splits, not 20.
        assert_eq!(shape(32, 1024, 2816, false), Some((64, 4, 8, 88)));
        assert_eq!(shape(32, 50257, 768, true), Some((32, 1, 1, 24)));
        // 40 rows: tiles of 32 and 16; a K of 64 in two chunks, one warp each.
        assert_eq!(shape(40, 2304, 768, false).map(|s| s.0), Some(32));
        assert_eq!(shape(40, 1000, 768, true).map(|s| s.0), Some(16));
        assert_eq!(shape(16, 64, 64, false), Some((64, 1, 1, 2)));
        // K not in chunks of 32, N not in packs, too many rows: none.
        assert_eq!(shape(16, 2304, 776, false), None);
        assert_eq!(shape(16, 2302, 768, false), None);
        assert_eq!(shape(65, 2304, 768, false), None);
    }

    #[test]
    fn a_warps_weights_are_one_trip_where_the_splits_allow() {
        // Every [K, N] product of the two decoders at 5 to 32 rows in tiles of 64 columns: at
        // most three chunks a warp (all requested before the wait) where K has at most 96
        // chunks (32 splits × 3).
        std::env::remove_var("FUSEC_SKINNY_WARPS");
        let products = [
            (2304, 768),
            (768, 768),
            (3072, 768),
            (768, 3072),
            (1536, 1024),
            (1024, 1024),
            (5632, 1024),
            (1024, 2816),
        ];
        for m in [5, 8, 13, 24, 25, 32] {
            for (n, k) in products {
                let (cols, warps, cluster, chunks) = shape(m, n, k, false).unwrap();
                if cols == 64 {
                    assert!(
                        chunks.div_ceil(warps * cluster) <= 3,
                        "{m} × {n} × {k}: {warps} warps × {cluster}"
                    );
                }
            }
        }
    }

    /// The most lanes of a warp whose stores of one accumulator fall in one bank at different
    /// addresses (1: none wait), with the template's mapping of lanes to outputs.
    fn bank_ways(rows: bool, cols: usize) -> usize {
        let stride = row_stride(cols, rows);
        let pack = cols / 8;
        let tiles = if rows { cols / 16 } else { pack / 2 };
        let mut worst = 0;
        for t in 0..tiles {
            for e in 0..4 {
                let mut banks = vec![std::collections::BTreeSet::new(); 32];
                for lane in 0..32 {
                    let (r, q) = (lane / 4, lane % 4);
                    let (rho, row) = (r + 8 * (e / 2), 2 * q + e % 2);
                    let col = if rows { 16 * t + rho } else { pack * (rho % 8) + 2 * t + rho / 8 };
                    let at = row * stride + col;
                    banks[at % 32].insert(at);
                }
                worst = worst.max(banks.iter().map(|b| b.len()).max().unwrap());
            }
        }
        worst
    }

    #[test]
    fn partial_sums_are_stored_without_bank_conflicts() {
        // B [N, K]: none; B [K, N]: at most two lanes a bank (eight and four unpadded).
        assert_eq!(bank_ways(true, 16), 1);
        assert_eq!(bank_ways(true, 32), 1);
        assert_eq!(bank_ways(false, 64), 2);
        assert_eq!(bank_ways(false, 32), 2);
    }
}
