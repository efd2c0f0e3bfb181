//! The tensor-core kernel for tens of rows with its last loads together
//! (`FUSEC_SKINNY_MMA_LOADS_TOGETHER=1`, off by default until measured): a block of a cluster
//! requests its epilogue's operands, the cluster's partial sums and a folded norm's statistics
//! one after another after the cluster's barrier, with no store between. A test binary of its
//! own, since it sets the knob for the whole process.

mod common;

use common::onnx::normed_block;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

/// A norm folded into the product after it at GPT-2 small's sizes at 32 rows (K split over a
/// cluster's blocks) and awkward ones at 29: in the PTX, every load between the cluster's
/// barrier and the block's comes before the first store to shared memory (where the knob is
/// off, the statistics' store comes first and holds the sums' loads back). On a GPU, forced
/// and chosen by timing, against tract, in f16 and bf16.
#[test]
fn a_folded_norms_statistics_come_with_the_clusters_sums() {
    std::env::set_var("FUSEC_SKINNY_MMA_LOADS_TOGETHER", "1");
    let dir = tempfile::tempdir().unwrap();
    for (rows, width, inner) in [(32, 768, 2304), (29, 352, 328)] {
        let path = normed_block(dir.path(), rows, width, inner);
        let options = CompileOptions { precision: DType::F16, ..Default::default() };
        let steps = common::compiled_steps(&path, &options);
        let folded = common::absorbing_kernels(&steps);
        assert_eq!(folded.len(), 1, "{rows} × {width} × {inner}: the norm taken in once");
        let k = folded[0];
        assert!(k.source.contains("one trip for all three"), "{}", k.source);
        if fusec::nvrtc::available() {
            common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
            let ptx = fusec::nvrtc::compile(k, "sm_90").unwrap();
            let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
            let wait = lines.iter().position(|l| l.starts_with("barrier.cluster.wait")).expect("a cluster");
            let sync =
                wait + lines[wait..].iter().position(|l| l.starts_with("bar.sync")).expect("a barrier");
            let between = &lines[wait..sync];
            let store =
                between.iter().position(|l| l.starts_with("st.shared")).expect("the statistics' store");
            let loads: Vec<usize> = (0..between.len())
                .filter(|&i| between[i].starts_with("ld.") && !between[i].starts_with("ld.param"))
                .collect();
            assert!(loads.len() > 2, "{rows} rows: too few loads after the cluster's barrier");
            assert!(
                loads.iter().all(|&i| i < store),
                "{rows} rows: a load after the statistics' store (loads {loads:?}, store {store})"
            );
        }
        common::forced_and_timed_match_tract(
            &path,
            rows as u64 + 200,
            &[(DType::F16, 1e-2), (DType::BF16, 3e-2)],
        );
    }
}
