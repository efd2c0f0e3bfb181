//! A residual add after a 1×1 convolution run as a GEMM joins the GEMM: cuBLASLt adds it as
//! β·C with the bias (and the ReLU after it), or the GEMM's epilogue kernel adds it where
//! cuBLASLt is not there; a residual read by a LayerNorm stays in the norm's prologue.

mod common;

use std::path::Path;

use common::onnx::{ints, node, weight, write_model};
use fusec::codegen::{LtActivation, Step};
use fusec::fusion::KernelKind;
use fusec::ir::DType;
use fusec::pipeline::{plan_reporting, CompileOptions};

/// A bottleneck: a 3×3 convolution and ReLU (the skip), another and ReLU, a 1×1 convolution
/// back to the skip's channels, the skip added, ReLU; at an awkward size (5×7, 24 channels,
/// batch 3).
fn bottleneck(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node("Conv", &["x", "ws", "bs"], "cs", vec![ints("pads", &[1, 1, 1, 1])]),
        node("Relu", &["cs"], "skip", vec![]),
        node("Conv", &["skip", "w0", "b0"], "c0", vec![ints("pads", &[1, 1, 1, 1])]),
        node("Relu", &["c0"], "r0", vec![]),
        node("Conv", &["r0", "w1", "b1"], "c1", vec![]),
        node("Add", &["c1", "skip"], "sum", vec![]),
        node("Relu", &["sum"], "y", vec![]),
    ];
    let init = vec![
        weight("ws", &[24, 5, 3, 3], 60, -0.3, 0.6),
        weight("bs", &[24], 59, -0.2, 0.4),
        weight("w0", &[16, 24, 3, 3], 61, -0.3, 0.6),
        weight("b0", &[16], 62, -0.2, 0.4),
        weight("w1", &[24, 16, 1, 1], 63, -0.5, 1.0),
        weight("b1", &[24], 64, -0.2, 0.4),
    ];
    write_model(dir, "bottleneck", &[3, 5, 5, 7], nodes, init)
}

#[test]
fn a_residual_after_a_gemm_joins_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = bottleneck(dir.path());
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<String> = plan.kernels.iter().map(|k| k.kind.name()).collect();
    assert!(kinds.contains(&"gemm+bias+residual+relu".to_string()), "{kinds:?}");
    // Only the layout changes at the ends are pointwise: the sum is not a kernel of its own.
    let adds = plan.kernels.iter().filter(|k| {
        k.kind == KernelKind::Pointwise && k.nodes.iter().any(|&n| plan.graph.node(n).op.kind() == "Add")
    });
    assert_eq!(adds.count(), 0, "{kinds:?}");
    let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{e}"));
    let gemms: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Gemm { gemm, epilogue, .. } => Some((gemm, epilogue)),
            _ => None,
        })
        .collect();
    assert_eq!(gemms.len(), 1);
    let (gemm, epilogue) = gemms[0];
    let lt = gemm.lt_epilogue.expect("cuBLASLt runs the epilogue");
    assert_eq!(lt.activation, LtActivation::Relu);
    let residual = lt.residual.expect("the residual is cuBLASLt's C");
    assert_ne!(residual, gemm.c, "the residual is the input, not the result");
    // The fallback epilogue kernel reads the residual too (one more pointer than the bias).
    let epilogue = epilogue.as_ref().expect("the epilogue kernel stays as the fallback");
    assert!(epilogue.args.contains(&residual), "{:?}", epilogue.args);
    if fusec::nvrtc::available() {
        for source in steps.iter().flat_map(Step::sources) {
            fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        }
    } else {
        eprintln!("skipping NVRTC compilation: NVRTC not found");
    }
}

/// BERT's residual adds feed LayerNorms: they stay in the norms' prologues, no GEMM takes one.
#[test]
fn residuals_read_by_a_layer_norm_stay_with_it() {
    let path = common::model_path("bert_ts.onnx");
    let options = common::shape_variants("bert_ts.onnx").remove(0);
    let options = CompileOptions { precision: DType::F16, import: options, ..Default::default() };
    let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<String> = plan.kernels.iter().map(|k| k.kind.name()).collect();
    assert!(!kinds.iter().any(|k| k.contains("residual")), "{kinds:?}");
}
