//! Squeeze-and-excitation gates (global pool → product → activation → product → gate →
//! scale) compile to the pool's first stage and one gate kernel, the gate folded into the
//! weights of the projection after it: the
//! `squeeze-excite` pass keeps the meaning (exactly in f32 on the IR, against tract through
//! the whole f16 pipeline), and the gate kernel compiles with NVRTC where it is found.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::onnx::{float, ints, node, weight, write_model};
use fusec::codegen::Step;
use fusec::fusion::{self, FusionLimits, KernelKind};
use fusec::import::{import, run_tract, ImportOptions};
use fusec::ir::{self, rel_l2, BinaryOp, DType, Graph, Op, Origin, ReduceOp, Tensor, TensorType, UnaryOp};
use fusec::passes::{run_passes, standard, ChannelsLast, Pass, SplitReductions};
use fusec::pipeline::{plan_reporting, CompileOptions};

/// A convolution and SiLU, then a gate of `hidden` units: EfficientNet's (SiLU between the
/// products, a sigmoid gate) or MobileNetV3's (ReLU, HardSigmoid), then a 1×1 projection.
fn block(dir: &Path, name: &str, hidden: i64, mobile: bool) -> std::path::PathBuf {
    let conv1 = |x: &str, w: &str, b: &str, y: &str| node("Conv", &[x, w, b], y, vec![]);
    let mut nodes = vec![
        node("Conv", &["x", "w0", "b0"], "c0", vec![ints("pads", &[1, 1, 1, 1])]),
        node("Sigmoid", &["c0"], "s0", vec![]),
        node("Mul", &["c0", "s0"], "a0", vec![]),
        node("GlobalAveragePool", &["a0"], "pooled", vec![]),
        conv1("pooled", "w1", "b1", "f1"),
    ];
    if mobile {
        nodes.push(node("Relu", &["f1"], "h", vec![]));
    } else {
        nodes.push(node("Sigmoid", &["f1"], "sf1", vec![]));
        nodes.push(node("Mul", &["f1", "sf1"], "h", vec![]));
    }
    nodes.push(conv1("h", "w2", "b2", "f2"));
    if mobile {
        let attributes = vec![float("alpha", 1.0 / 6.0), float("beta", 0.5)];
        nodes.push(node("HardSigmoid", &["f2"], "gate", attributes));
    } else {
        nodes.push(node("Sigmoid", &["f2"], "gate", vec![]));
    }
    nodes.push(node("Mul", &["a0", "gate"], "scaled", vec![]));
    nodes.push(conv1("scaled", "w3", "b3", "y"));
    let init = vec![
        weight("w0", &[24, 12, 3, 3], 51, -0.3, 0.6),
        weight("b0", &[24], 52, -0.2, 0.4),
        weight("w1", &[hidden, 24, 1, 1], 53, -0.5, 1.0),
        weight("b1", &[hidden], 54, -0.2, 0.4),
        weight("w2", &[24, hidden, 1, 1], 55, -0.5, 1.0),
        weight("b2", &[24], 56, -0.2, 0.4),
        weight("w3", &[16, 24, 1, 1], 57, -0.3, 0.6),
        weight("b3", &[16], 58, -0.2, 0.4),
    ];
    write_model(dir, name, &[3, 12, 9, 7], nodes, init)
}

/// Each variant, compiled in f16 channels-last: one gate kernel, no GEMM of the gate's
/// few rows left, the compiled program's graph within f16 tolerance of tract, and every
/// kernel compiling with NVRTC.
#[test]
fn gates_compile_to_one_kernel_and_match_tract() {
    let dir = tempfile::tempdir().unwrap();
    // Hidden widths a GEMM takes as they are (8), and ones it pads (6) or leaves a
    // convolution (10).
    for (name, hidden, mobile) in [("efficient", 6, false), ("mobile", 8, true), ("odd", 10, false)] {
        let path = block(dir.path(), name, hidden, mobile);
        let model = import(&path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let inputs = common::random_inputs(&model, 9);
        let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
        let values: Vec<Tensor> = inputs.into_iter().map(|(_, t)| t).collect();
        let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
        let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
        let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
        // The compiled program's graph, its stages run here (the plan's own has given its
        // weights to the blob).
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap();
        let fused = fusion::fuse(&graph, &FusionLimits::default()).unwrap_or_else(|e| panic!("{e}"));
        let (mut graph, _) = fusec::passes::lower_precision(fused.graph, DType::F16).unwrap();
        ChannelsLast.run(&mut graph).unwrap();
        SplitReductions.run(&mut graph).unwrap();
        let made = fusec::passes::squeeze_excite(&mut graph, &mut HashMap::new()).unwrap();
        assert_eq!(made, 1, "{name}: {}", ir::dump(&graph).unwrap());
        ir::verify(&graph).unwrap();
        let ours = ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
        let err = rel_l2(&ours[0].1, &theirs[0]);
        assert!(err <= 1e-2, "{name}: f16 program, rel-L2 {err:e}");
        let kinds: Vec<String> = plan.kernels.iter().map(|k| k.kind.name()).collect();
        let gates = plan.kernels.iter().filter(|k| k.kind == KernelKind::Single { op: "ChannelGate".into() });
        assert_eq!(gates.count(), 1, "{name}: {kinds:?}");
        let reductions = kinds.iter().filter(|k| k.contains("reduce")).count();
        assert_eq!(reductions, 1, "{name}: the pool's first stage only: {kinds:?}");
        let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let small = steps.iter().any(|s| matches!(s, Step::Gemm { gemm, .. } if gemm.m * gemm.batch <= 3));
        assert!(!small, "{name}: a GEMM of the gate's rows is left");
        // The projection (16 outputs, 63 positions a sample) takes the gate folded into its
        // weights: a batch of 3 products, its bias on cuBLASLt; no scaling kernel is left.
        let projections: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Gemm { gemm, .. } if gemm.batch == 3 => {
                    Some((gemm.m, gemm.n, gemm.k, gemm.lt_epilogue.is_some()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(projections, [(63, 16, 24, true)], "{name}");
        let pointwise = plan.kernels.iter().filter(|k| k.kind == KernelKind::Pointwise).count();
        assert_eq!(pointwise, 2, "{name}: the input's cast and the output's, no scaling: {kinds:?}");
        if fusec::nvrtc::available() {
            for source in steps.iter().flat_map(Step::sources) {
                fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        } else {
            eprintln!("skipping NVRTC compilation: NVRTC not found");
        }
    }
}

fn constant(g: &mut Graph, name: &str, shape: &[usize], seed: u64) -> ir::NodeId {
    let mut next = common::xorshift(seed);
    let count: usize = shape.iter().product();
    let values: Vec<f64> = (0..count).map(|_| (next() % 10_000) as f64 / 10_000.0 - 0.5).collect();
    let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values).unwrap();
    g.add_constant(name, Arc::new(Tensor::from_f64(array, DType::F32)), Origin::new(name, "Test"))
}

/// On the IR in f32: the rewrite is exact (its f64 evaluation against the chain's), takes
/// the zero-padded product, the 1×1 channels-last convolution and HardSigmoid, folds the gate
/// into a projection after it (one batched product left, no scaling), keeps the
/// ONNX names of what it replaces, and leaves a chain read from outside alone.
#[test]
fn the_rewrite_is_exact_on_the_ir() {
    let origin = |name: &str| Origin::new(name, "Test");
    for (variant, outside) in [(0, false), (1, false), (0, true), (2, false)] {
        let mut g = Graph::new();
        let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 5, 1, 12]));
        let pool = g
            .add_op(
                Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keep_dims: true },
                &[x],
                "pool",
                origin("pool"),
            )
            .unwrap();
        let w1 = constant(&mut g, "w1", &[12, 5], 1);
        let m1 = g.add_op(Op::MatMul, &[pool, w1], "m1", origin("fc1")).unwrap();
        let b1 = constant(&mut g, "b1", &[5], 2);
        let a1 = g.add_op(Op::Binary(BinaryOp::Add), &[m1, b1], "a1", origin("fc1_bias")).unwrap();
        let s1 = g.add_op(Op::Unary(UnaryOp::Sigmoid), &[a1], "s1", origin("silu_sigmoid")).unwrap();
        let h = g.add_op(Op::Binary(BinaryOp::Mul), &[a1, s1], "h", origin("silu")).unwrap();
        let (gated, zeros_concat) = if variant != 1 {
            // Zero padding to 8, a MatMul, a bias, a sigmoid.
            let zeros = g.add_constant(
                "zeros",
                Arc::new(Tensor::full(&TensorType::new(DType::F32, vec![2, 1, 1, 3]), 0.0)),
                origin("pad"),
            );
            let padded = g.add_op(Op::Concat { axis: 3 }, &[h, zeros], "padded", origin("pad")).unwrap();
            let w2 = constant(&mut g, "w2", &[8, 12], 3);
            let m2 = g.add_op(Op::MatMul, &[padded, w2], "m2", origin("fc2")).unwrap();
            let b2 = constant(&mut g, "b2", &[12], 4);
            let a2 = g.add_op(Op::Binary(BinaryOp::Add), &[b2, m2], "a2", origin("fc2_bias")).unwrap();
            (g.add_op(Op::Unary(UnaryOp::Sigmoid), &[a2], "gate", origin("gate")).unwrap(), true)
        } else {
            // A 1×1 channels-last convolution with its bias, then HardSigmoid.
            let w2 = constant(&mut g, "w2", &[12, 1, 1, 5], 3);
            let b2 = constant(&mut g, "b2", &[12], 4);
            let conv =
                Op::Conv { strides: [1, 1], pads: [0; 4], dilations: [1, 1], group: 1, channels_last: true };
            let c2 = g.add_op(conv, &[h, w2, b2], "c2", origin("fc2")).unwrap();
            let alpha = g.add_constant("alpha", Arc::new(Tensor::scalar_f32(0.2)), origin("hs"));
            let beta = g.add_constant("beta", Arc::new(Tensor::scalar_f32(0.5)), origin("hs"));
            let m = g.add_op(Op::Binary(BinaryOp::Mul), &[c2, alpha], "hs_mul", origin("hs")).unwrap();
            let a = g.add_op(Op::Binary(BinaryOp::Add), &[m, beta], "hs_add", origin("hs")).unwrap();
            (g.add_op(Op::Clip { min: 0.0, max: 1.0 }, &[a], "gate", origin("gate")).unwrap(), false)
        };
        let mut y = g.add_op(Op::Binary(BinaryOp::Mul), &[x, gated], "y", origin("scale")).unwrap();
        if variant == 2 {
            // A projection to 4 outputs of 5 positions a sample: the gate folds into it.
            let wp = constant(&mut g, "wp", &[12, 4], 5);
            y = g.add_op(Op::MatMul, &[y, wp], "projected", origin("projection")).unwrap();
        }
        let mut outputs = vec![("y".to_string(), y)];
        if outside {
            outputs.push(("hidden".into(), h));
        }
        g.set_outputs(outputs);
        ir::verify(&g).unwrap();
        let mut next = common::xorshift(11);
        let values: Vec<f64> = (0..120).map(|_| (next() % 10_000) as f64 / 5_000.0 - 1.0).collect();
        let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[2, 5, 1, 12]), values).unwrap();
        let feeds = HashMap::from([("x".to_string(), Tensor::from_f64(array, DType::F32))]);
        let before = ir::evaluate(&g, &feeds).unwrap();
        let mut covers = HashMap::new();
        let made = fusec::passes::squeeze_excite(&mut g, &mut covers).unwrap();
        ir::verify(&g).unwrap();
        if outside {
            assert_eq!(made, 0, "a chain with a value read outside it stays");
            continue;
        }
        assert_eq!(made, 1, "variant {variant}");
        let histogram = g.op_histogram();
        assert_eq!(histogram.get("ChannelGate"), Some(&1), "{histogram:?}");
        let folded = usize::from(variant == 2);
        assert_eq!(histogram.get("MatMul").copied().unwrap_or(0), folded, "{histogram:?}");
        assert_eq!(histogram.get("Mul").copied().unwrap_or(0), 1 - folded, "{histogram:?}");
        for gone in ["Sigmoid", "Conv", "Clip", "Concat", "ReduceMean"] {
            assert_eq!(histogram.get(gone), None, "variant {variant}: {histogram:?}");
        }
        let gate = g.node_ids().find(|&n| g.node(n).op.kind() == "ChannelGate").unwrap();
        let names: Vec<&str> = g.node(gate).origin.onnx_nodes().collect();
        for name in ["pool", "fc1", "fc2", "silu", "gate"] {
            assert!(names.contains(&name), "variant {variant}: {names:?}");
        }
        assert_eq!(zeros_concat, names.contains(&"pad"), "{names:?}");
        let after = ir::evaluate(&g, &feeds).unwrap();
        let err = rel_l2(&after[0].1, &before[0].1);
        assert!(err <= 1e-6, "variant {variant}: rel-L2 {err:e}");
        assert!(after[0].1.to_f64_vec().iter().any(|&v| v != 0.0));
    }
}
