//! A decoder layer's MLP at a few rows as one kernel (`skinny::mlp`): the norm, the first
//! product and its activation, the second product and its epilogue in one launch. A test
//! binary of its own, since it sets `FUSEC_SKINNY_MLP=1` (the MLP kernel the only kernel for a
//! few rows where there is one) for the whole process.

mod common;

use std::path::{Path, PathBuf};

use common::onnx::{float, int, node, weight, write_model};
use fusec::codegen::{KernelSource, Step};
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

/// `rows` rows of `width` as a transformer block's second half: `h = x + x·w0`, its LayerNorm,
/// a product `inner` wide with a bias and ReLU, one back with a bias and the residual `h`.
fn mlp_block(dir: &Path, rows: i64, width: i64, inner: i64) -> PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "w0"], "y", vec![]),
        node("Add", &["x", "y"], "h", vec![]),
        node(
            "LayerNormalization",
            &["h", "gamma", "beta"],
            "n",
            vec![int("axis", -1), float("epsilon", 1e-5)],
        ),
        node("MatMul", &["n", "w1"], "z1", vec![]),
        node("Add", &["z1", "b1"], "z2", vec![]),
        node("Relu", &["z2"], "z", vec![]),
        node("MatMul", &["z", "w2"], "o1", vec![]),
        node("Add", &["o1", "b2"], "o", vec![]),
        node("Add", &["o", "h"], "out", vec![]),
    ];
    let init = vec![
        weight("w0", &[width, width], 91, -0.1, 0.2),
        weight("gamma", &[width], 92, 0.5, 1.0),
        weight("beta", &[width], 93, -0.5, 1.0),
        weight("w1", &[width, inner], 94, -0.2, 0.4),
        weight("b1", &[inner], 95, -0.3, 0.6),
        weight("w2", &[inner, width], 96, -0.2, 0.4),
        weight("b2", &[width], 97, -0.3, 0.6),
    ];
    write_model(dir, &format!("mlp{rows}_{width}_{inner}"), &[rows, width], nodes, init)
}

/// The MLP kernels of `steps`, each with the steps it stands in for.
fn mlp_kernels(steps: &[Step]) -> Vec<&KernelSource> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Gemm { mlp: Some(k), .. } => Some(&**k),
            _ => None,
        })
        .collect()
}

/// GPT-2 small's MLP sizes at 32 and 1 rows, and awkward ones (29 rows: a last tile of five;
/// 7), in f16: one MLP kernel standing in for the norm and the first product (its `merges`),
/// through NVRTC and ptxas without spills; on a GPU, forced and chosen by timing, against tract
/// in f16 and bf16 (where bf16 keeps the residual sum in f32, the norm stays apart and the
/// kernel reads the norm's output, or the block has no such kernel).
#[test]
fn an_mlp_runs_as_one_kernel_and_matches_tract() {
    std::env::set_var("FUSEC_SKINNY_MLP", "1");
    let dir = tempfile::tempdir().unwrap();
    for (rows, width, inner) in [(32, 768, 3072), (1, 768, 3072), (29, 352, 320), (7, 96, 160)] {
        let path = mlp_block(dir.path(), rows, width, inner);
        let steps =
            common::compiled_steps(&path, &CompileOptions { precision: DType::F16, ..Default::default() });
        let mlp = mlp_kernels(&steps);
        assert_eq!(mlp.len(), 1, "{rows} × {width} × {inner}: one MLP kernel");
        let k = mlp[0];
        assert_eq!(k.grid as i64, inner / 32);
        // The norm's kernel and the first product's step, the two before it.
        let at = steps.iter().position(|s| matches!(s, Step::Gemm { mlp: Some(_), .. })).unwrap();
        assert_eq!(k.merges, vec![at - 2, at - 1], "{rows} × {width} × {inner}");
        assert!(matches!(steps[at - 1], Step::Gemm { .. }) && matches!(steps[at - 2], Step::Launch(_)));
        assert!(
            k.source.contains("LayerNorm") && k.source.contains("h_out") && k.source.contains("residual")
        );
        if fusec::nvrtc::available() {
            common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
        }
        common::forced_and_timed_match_tract(
            &path,
            rows as u64 + 300,
            &[(DType::F16, 1e-2), (DType::BF16, 3e-2)],
        );
    }
}

/// A decoding step of the GPT-2 cache fixture (LayerNorms of a sum, GELU) at 1, 13 and 32
/// rows: each layer's MLP as one kernel, through NVRTC without spills; on a GPU, forced, against
/// tract.
#[test]
fn a_decoding_steps_mlps_run_as_one_kernel() {
    std::env::set_var("FUSEC_SKINNY_MLP", "1");
    for batch in [1, 13, 32] {
        let (path, options) = common::decoding_step("gpt2_cache_ts.onnx", batch);
        let steps = common::compiled_steps(&path, &options);
        let mlp = mlp_kernels(&steps);
        assert_eq!(mlp.len(), 2, "GPT-2 fixture at {batch}: a kernel a layer");
        let dir = tempfile::tempdir().unwrap();
        for k in mlp {
            assert!(k.source.contains("gelu_tanh") && k.source.contains("LayerNorm"), "{}", k.source);
            if fusec::nvrtc::available() {
                common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
            }
        }
        common::forced_skinny_matches_tract(&path, &options, 7, 1e-2);
    }
}
