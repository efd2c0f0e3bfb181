//! GEMM epilogues cuBLASLt runs without a bias: a ConvNeXt-style MLP (a Linear whose zero
//! bias was dropped, erf-GELU, a Linear, a uniform layer scale, the residual add) compiles in
//! f16 to two GEMMs and no pointwise kernel between the convolutions: the erf-GELU in its tanh
//! form in the first GEMM's epilogue, the scale as the second's α and the residual as its β·C.
//! The rewritten program stays within f16 tolerance of tract; `exact_gelu` keeps erf; a GELU
//! that does not follow a GEMM is never rewritten. On a GPU the bundle runs against tract.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::onnx::{int, ints, node, weight, write_model};
use fusec::codegen::{LtActivation, LtEpilogue, Step};
use fusec::fusion::{self, FusionLimits};
use fusec::ir::{self, rel_l2, DType, Graph, Op, Origin, Tensor, TensorType, UnaryOp};
use fusec::passes::{run_passes, standard, ChannelsLast, Pass, SplitReductions};
use fusec::pipeline::{plan_reporting, CompileOptions};

const HALF_TOLERANCE: f64 = 1e-2;

/// Stem convolution, depthwise 7×7, to channels-last, MatMul (no bias), erf-GELU as exported
/// (`x · 0.5 · (1 + erf(x / √2))`), MatMul back, to NCHW, a uniform layer scale, the residual
/// add, another depthwise convolution; 16 channels at 9×7, batch 3.
fn block(dir: &Path) -> std::path::PathBuf {
    let depthwise = |x: &str, w: &str, y: &str| {
        node("Conv", &[x, w], y, vec![ints("pads", &[3, 3, 3, 3]), int("group", 16)])
    };
    let nodes = vec![
        node("Conv", &["x", "ws"], "s", vec![ints("pads", &[1, 1, 1, 1])]),
        depthwise("s", "wd", "d"),
        node("Transpose", &["d"], "t", vec![ints("perm", &[0, 2, 3, 1])]),
        node("MatMul", &["t", "w1"], "m1", vec![]),
        node("Div", &["m1", "sqrt2"], "q", vec![]),
        node("Erf", &["q"], "e", vec![]),
        node("Add", &["e", "one"], "e1", vec![]),
        node("Mul", &["m1", "e1"], "g0", vec![]),
        node("Mul", &["g0", "half"], "h", vec![]),
        node("MatMul", &["h", "w2"], "m2", vec![]),
        node("Transpose", &["m2"], "back", vec![ints("perm", &[0, 3, 1, 2])]),
        node("Mul", &["gamma", "back"], "scaled", vec![]),
        node("Add", &["scaled", "s"], "sum", vec![]),
        depthwise("sum", "wd2", "y"),
    ];
    let init = vec![
        weight("ws", &[16, 16, 3, 3], 80, -0.3, 0.6),
        weight("wd", &[16, 1, 7, 7], 81, -0.3, 0.6),
        weight("w1", &[16, 64], 82, -0.5, 1.0),
        weight("w2", &[64, 16], 83, -0.5, 1.0),
        weight("wd2", &[16, 1, 7, 7], 84, -0.3, 0.6),
        weight("gamma", &[16, 1, 1], 85, 0.25, 0.0),
        weight("sqrt2", &[], 86, std::f32::consts::SQRT_2, 0.0),
        weight("one", &[], 87, 1.0, 0.0),
        weight("half", &[], 88, 0.5, 0.0),
    ];
    write_model(dir, "mlp_block", &[3, 16, 9, 7], nodes, init)
}

/// The compiled GEMMs' cuBLASLt epilogues, in program order.
fn lt_epilogues(path: &Path, options: &CompileOptions) -> (Vec<String>, Vec<Option<LtEpilogue>>) {
    let (plan, _) = plan_reporting(path, options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<String> = plan.kernels.iter().map(|k| k.kind.name()).collect();
    let lts = common::compiled_steps(path, options)
        .iter()
        .filter_map(|s| match s {
            Step::Gemm { gemm, .. } => Some(gemm.lt_epilogue),
            _ => None,
        })
        .collect();
    (kinds, lts)
}

#[test]
fn a_convnext_mlp_runs_its_epilogues_in_cublaslt() {
    let dir = tempfile::tempdir().unwrap();
    let path = block(dir.path());
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    let (kinds, lts) = lt_epilogues(&path, &options);
    // The input's cast, the convolutions, two GEMMs, the output's cast to f32 stored in its
    // layout (one kernel, after the last convolution rather than in it: a convolution's kernel
    // keeps its own type): no pointwise kernel between the convolutions.
    let expected = ["pointwise", "conv", "conv", "gemm+gelutanh", "gemm+scale+residual", "conv", "pointwise"];
    assert_eq!(kinds, expected);
    let [Some(first), Some(second)] = lts[..] else { panic!("two GEMMs, both on cuBLASLt: {lts:?}") };
    assert_eq!((first.bias, first.activation, first.residual), (None, LtActivation::GeluTanh, None));
    assert_eq!(first.scale(), 1.0);
    assert_eq!((second.bias, second.activation), (None, LtActivation::None));
    assert!(second.residual.is_some(), "{second:?}");
    assert_eq!(second.scale(), 0.25);
    assert_eq!(second.describe(), "scale+residual");

    // With erf kept, the first GEMM's epilogue is a kernel of fusec's again.
    let exact = CompileOptions { exact_gelu: true, ..options.clone() };
    let (kinds, lts) = lt_epilogues(&path, &exact);
    assert_eq!(kinds[3], "gemm+gelu", "{kinds:?}");
    assert_eq!(lts[0], None, "{lts:?}");
    assert!(lts[1].is_some());

    // The program as compiled (stages run here: the plan's graph has given its weights to the
    // blob) against tract.
    let (model, inputs, theirs) = common::tract_on_random_inputs(&path, 5);
    let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    let fused = fusion::fuse(&graph, &FusionLimits::default()).unwrap_or_else(|e| panic!("{e}"));
    let (mut graph, _) = fusec::passes::lower_precision(fused.graph, DType::F16).unwrap();
    ChannelsLast.run(&mut graph).unwrap();
    SplitReductions.run(&mut graph).unwrap();
    assert_eq!(fusec::passes::gelu_after_gemm_as_tanh(&mut graph).unwrap(), 1);
    ir::verify(&graph).unwrap();
    let ours = ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= HALF_TOLERANCE, "f16 program with tanh-GELU: rel-L2 {err:e}");

    // On a GPU: the bundle, cuBLASLt's epilogues included, against tract.
    common::gpu_matches_tract(&path, &options, &inputs, &theirs, HALF_TOLERANCE);
}

/// Only an erf-GELU reading a GEMM's result (behind its bias) alone is rewritten: not one of
/// an input, nor one whose GEMM result is read elsewhere too.
#[test]
fn only_a_gelu_after_a_gemm_takes_the_tanh_form() {
    let mut g = Graph::new();
    let f16 = |shape: &[usize]| TensorType::new(DType::F16, shape.to_vec());
    let x = g.add_input("x", f16(&[4, 8]));
    let w = g.add_constant("w", Arc::new(Tensor::full(&f16(&[8, 8]), 0.125)), Origin::new("w", "Test"));
    let b = g.add_constant("b", Arc::new(Tensor::full(&f16(&[8]), 0.5)), Origin::new("b", "Test"));
    let origin = |name: &str| Origin::new(name, "Test");
    let gelu = Op::Unary(UnaryOp::Gelu);
    let direct = g.add_op(gelu.clone(), &[x], "direct", origin("direct")).unwrap();
    let m1 = g.add_op(Op::MatMul, &[x, w], "m1", origin("m1")).unwrap();
    let biased = g.add_op(Op::Binary(ir::BinaryOp::Add), &[m1, b], "biased", origin("biased")).unwrap();
    let after = g.add_op(gelu.clone(), &[biased], "after", origin("after")).unwrap();
    let m2 = g.add_op(Op::MatMul, &[x, w], "m2", origin("m2")).unwrap();
    let shared = g.add_op(gelu, &[m2], "shared", origin("shared")).unwrap();
    g.set_outputs(vec![
        ("direct".into(), direct),
        ("after".into(), after),
        ("shared".into(), shared),
        ("m2".into(), m2),
    ]);
    assert_eq!(fusec::passes::gelu_after_gemm_as_tanh(&mut g).unwrap(), 1);
    let op = |id| g.node(id).op.clone();
    assert_eq!(op(after), Op::Unary(UnaryOp::GeluTanh));
    assert_eq!(op(direct), Op::Unary(UnaryOp::Gelu));
    assert_eq!(op(shared), Op::Unary(UnaryOp::Gelu));
}
