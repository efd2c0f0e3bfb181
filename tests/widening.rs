//! A half-type product whose only reader casts it to f32 stores f32 itself
//! (`fusion/partition/widening.rs`, `GemmSpec::out`): here a batched product, both operands
//! batches, which no kernel for a few rows takes and cuBLASLt runs only with an epilogue, so
//! cuBLAS's `GemmEx` stores its f32 C. (The vocabulary's product, on fusec's kernel and
//! cuBLASLt, is `tests/skinny_gemm.rs`' odd-width head.)

mod common;

use common::onnx::{node, weight, write_model};
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

/// `[2, 3, 8] · [2, 8, 5]` (the weights a batch of two matrices) compiled in fp16 and bf16:
/// the input's cast to the half type, then the product storing the f32 output, no cast
/// kernel after it; with `FUSEC_GEMM_WIDENS=0`, the cast a kernel of its own. On a GPU, both
/// against tract.
#[test]
fn a_batched_product_stores_its_f32_output_itself() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![node("MatMul", &["x", "w"], "y", vec![])];
    let init = vec![weight("w", &[2, 8, 5], 31, -0.5, 1.0)];
    let path = write_model(dir.path(), "batched", &[2, 3, 8], nodes, init);
    let (_, inputs, theirs) = common::tract_on_random_inputs(&path, 5);
    for precision in [DType::F16, DType::BF16] {
        let options = CompileOptions { precision, ..Default::default() };
        let steps = common::compiled_steps(&path, &options);
        assert_eq!(steps.len(), 2, "{precision}: {steps:?}");
        let Step::Gemm { gemm, skinny: None, epilogue: None, .. } = &steps[1] else { panic!("{steps:?}") };
        assert_eq!((gemm.batch, gemm.m, gemm.n, gemm.k), (2, 3, 5, 8), "{gemm:?}");
        assert_eq!((gemm.dtype, gemm.out), (precision, Some(DType::F32)), "{gemm:?}");
        common::gpu_matches_tract(&path, &options, &inputs, &theirs, 1e-2);
    }
    std::env::set_var("FUSEC_GEMM_WIDENS", "0");
    let options = CompileOptions { precision: DType::F16, ..Default::default() };
    let steps = common::compiled_steps(&path, &options);
    std::env::remove_var("FUSEC_GEMM_WIDENS");
    assert_eq!(steps.len(), 3, "{steps:?}");
    let Step::Gemm { gemm, .. } = &steps[1] else { panic!("{steps:?}") };
    assert_eq!(gemm.out, None, "{gemm:?}");
}
