//! A vocabulary's projection at tens of rows on tensor cores with A staged in shared memory
//! (`templates/skinny_staged.cu.hbs`): the step's second kernel for such a product, timed
//! against the tensor-core kernel of `mma.rs` at load. There each warp (one a block) reads all
//! of A itself from L2, as many bytes as its share of the weights and in trips after each of
//! its weights' trips; here a block of [`WARPS`] warps copies A into shared memory once, and
//! its warps read it there.

use handlebars::Handlebars;
use serde_json::{json, Value};

use super::super::gemm::GemmSpec;
use super::super::kernel::render;
use super::{extend, WIDE};
use crate::knobs::{off, one_of};

/// Warps a block, each a tile of [`COLS`] columns.
const WARPS: usize = 4;

/// Output columns a warp: two mma tiles of 16.
const COLS: usize = 32;

/// Chunks of 32 down K a warp has in flight (as the tensor-core kernel's `ROWS_UNROLL`).
const UNROLL: usize = 6;

/// Blocks a multiprocessor the launch bounds ask for: 12 warps, whose registers (no A in
/// flight) leave the 48 KB of A a block room three times over, and GPT-2's vocabulary's 393
/// blocks one wave on 132 multiprocessors.
const MIN_BLOCKS: usize = 3;

/// The most bytes of A a block stages (the static shared-memory limit).
const A_BYTES: usize = 48 << 10;

/// The staged kernel's source and launch `(source, grid, block)` for `g` (B stored `[N, K]`,
/// a half type), whose common template data (`data`) the caller made: where the product is a
/// vocabulary's ([`WIDE`] columns or more) of at most 32 rows, K in chunks of 64, and A fits
/// [`A_BYTES`]. `FUSEC_SKINNY_STAGED=0` makes none, for measuring it.
pub fn generate(
    g: &GemmSpec,
    mut data: Value,
    hb: &Handlebars<'_>,
) -> Result<Option<(String, u32, u32)>, String> {
    let (m, n, k) = (g.m, g.n, g.k);
    let fits = m * k * g.dtype.size_bytes() <= A_BYTES;
    if !g.b.transposed || n < WIDE || m > 32 || k % 64 != 0 || !fits || off("FUSEC_SKINNY_STAGED") {
        return Ok(None);
    }
    let m_tiles = m.div_ceil(8);
    let unroll = one_of("FUSEC_SKINNY_MMA_UNROLL", &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap_or(UNROLL);
    let block = WARPS * 32;
    let grid = n.div_ceil(WARPS * COLS);
    extend(
        &mut data,
        json!({
            "block": block,
            "warps": WARPS,
            "min_blocks": MIN_BLOCKS,
            "cols": COLS,
            "tiles": COLS / 16,
            "m_tiles": m_tiles,
            "m_pad": 8 * m_tiles,
            "chunks": k / 32,
            "unroll": unroll,
            // 16-byte units of a row of A.
            "units": k / 8,
        }),
    );
    let source = render(hb, "skinny_staged", &data)?;
    Ok(Some((source, grid as u32, block as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::{GemmOperand, KernelSource};
    use crate::ir::DType;
    use crate::plan::Location;

    fn spec(m: usize, n: usize, k: usize) -> GemmSpec {
        GemmSpec {
            a: GemmOperand { location: Location::Arena(0), transposed: false, batch_stride: 0 },
            b: GemmOperand { location: Location::Weights(256), transposed: true, batch_stride: 0 },
            c: Location::Arena(1 << 20),
            m,
            n,
            k,
            batch: 1,
            alpha: 1.0,
            dtype: DType::F16,
            out: Some(DType::F32),
            lt_epilogue: None,
            dims: None,
        }
    }

    fn second(g: &GemmSpec) -> Option<KernelSource> {
        let hb = super::super::super::templates().unwrap();
        super::super::generate(g, (false, super::super::Tiling::Narrow), (None, None), "k", &hb).unwrap()
    }

    #[test]
    fn a_vocabulary_at_tens_of_rows_gets_a_second_kernel_with_a_staged() {
        if std::env::var_os("FUSEC_SKINNY_STAGED").is_some() {
            return;
        }
        // GPT-2's vocabulary at 32 rows: 393 blocks of four warps, A's 48 KB in shared memory.
        let vocabulary = second(&spec(32, 50257, 768)).expect("a staged kernel");
        assert_eq!((vocabulary.grid, vocabulary.block), (393, 128));
        assert!(vocabulary.name.ends_with("_skinny_staged"), "{}", vocabulary.name);
        assert!(vocabulary.source.contains("uint4 xa[32 * 96]"), "{}", vocabulary.source);
        // (Compiled through NVRTC and ptxas, no spills, by `tests/skinny_gemm.rs`.)
        // At an odd 29 rows and 8; the Llama-style decoder's (1,024 deep) at 16 rows but not 32
        // (64 KB of A); narrower products, K not in chunks of 64, one or two rows: none.
        assert!(second(&spec(29, 20011, 768)).is_some());
        assert!(second(&spec(8, 32000, 1024)).is_some());
        assert!(second(&spec(16, 32000, 1024)).is_some());
        assert!(second(&spec(32, 32000, 1024)).is_none());
        assert!(second(&spec(32, 4096, 768)).is_none());
        assert!(second(&spec(32, 50257, 800)).is_none());
        assert!(second(&spec(2, 50257, 768)).is_none());
    }
}
