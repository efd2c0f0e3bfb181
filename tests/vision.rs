//! The convolutional-network ops (pooling, BatchNormalization, the hard activations, Mish)
//! at awkward shapes — odd sizes, asymmetric pads, ceil_mode, dilation — against tract on
//! the CPU: imported, through the passes and fusion, and every kernel they become compiled
//! with NVRTC where it is found.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::onnx::{float, floats, int, int64s, ints, node, string, weight, write_model};
use fusec::fusion::{self, FusionLimits};
use fusec::import::{import, run_tract, ImportOptions};
use fusec::ir::{self, rel_l2, DType};
use fusec::passes::{run_passes, standard};
use fusec::pipeline::{plan_reporting, CompileOptions};
use tract_onnx::pb::{attribute_proto::AttributeType, AttributeProto};

const TOLERANCE: f64 = 1e-5;

/// A block of a small CNN: convolution (asymmetric pads, stride 2), BatchNormalization,
/// HardSwish, a ceil-mode max pool with padding, an average pool counting its padding,
/// HardSigmoid, Mish and a global average pool.
fn cnn_block(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node("Conv", &["x", "w", "b"], "conv", vec![ints("pads", &[1, 0, 2, 1]), ints("strides", &[2, 1])]),
        node(
            "BatchNormalization",
            &["conv", "scale", "shift", "mean", "var"],
            "bn",
            vec![float("epsilon", 1e-3)],
        ),
        node("HardSwish", &["bn"], "hswish", vec![]),
        node(
            "MaxPool",
            &["hswish"],
            "maxpool",
            vec![
                ints("kernel_shape", &[3, 2]),
                ints("strides", &[2, 2]),
                ints("pads", &[1, 0, 1, 1]),
                int("ceil_mode", 1),
            ],
        ),
        node(
            "AveragePool",
            &["maxpool"],
            "avgpool",
            vec![ints("kernel_shape", &[2, 3]), ints("pads", &[0, 1, 1, 1]), int("count_include_pad", 1)],
        ),
        node("HardSigmoid", &["avgpool"], "hsig", vec![float("alpha", 0.3), float("beta", 0.4)]),
        node("Mish", &["hsig"], "mish", vec![]),
        node("GlobalAveragePool", &["mish"], "y", vec![]),
    ];
    let init = vec![
        weight("w", &[5, 3, 3, 2], 1, -0.5, 1.0),
        weight("b", &[5], 2, -0.2, 0.4),
        weight("scale", &[5], 3, 0.5, 1.0),
        weight("shift", &[5], 4, -0.3, 0.6),
        weight("mean", &[5], 5, -0.2, 0.4),
        weight("var", &[5], 6, 0.2, 1.5),
    ];
    write_model(dir, "cnn_block", &[2, 3, 11, 13], nodes, init)
}

/// Pools alone: average excluding padding in ceil mode, and a dilated max pool with
/// `SAME_LOWER` padding, then the global max.
fn pools(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node(
            "AveragePool",
            &["x"],
            "avg",
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("strides", &[2, 3]),
                ints("pads", &[1, 2, 0, 1]),
                int("ceil_mode", 1),
            ],
        ),
        node(
            "MaxPool",
            &["avg"],
            "max",
            vec![
                ints("kernel_shape", &[2, 2]),
                ints("dilations", &[2, 1]),
                AttributeProto {
                    name: "auto_pad".into(),
                    s: b"SAME_LOWER".to_vec(),
                    r#type: AttributeType::String as i32,
                    ..Default::default()
                },
            ],
        ),
        node("Softplus", &["max"], "soft", vec![]),
        node("GlobalMaxPool", &["soft"], "y", vec![]),
    ];
    write_model(dir, "pools", &[3, 4, 13, 17], nodes, vec![])
}

/// Resizes and pads at awkward sizes: linear (half_pixel) to 11×5 by sizes, reflect padding,
/// nearest (asymmetric, round_prefer_ceil) by scales 1.5×2, edge padding, linear
/// (align_corners) by sizes, constant padding.
fn resizes(dir: &Path) -> std::path::PathBuf {
    let resize = |x: &str, scales: &str, sizes: &str, y: &str, attrs: Vec<AttributeProto>| {
        node("Resize", &[x, "", scales, sizes], y, attrs)
    };
    let nodes = vec![
        resize("x", "", "sizes1", "r1", vec![string("mode", "linear")]),
        node("Pad", &["r1", "pads1"], "p1", vec![string("mode", "reflect")]),
        resize(
            "p1",
            "scales2",
            "",
            "r2",
            vec![
                string("coordinate_transformation_mode", "asymmetric"),
                string("nearest_mode", "round_prefer_ceil"),
            ],
        ),
        node("Pad", &["r2", "pads2"], "p2", vec![string("mode", "edge")]),
        resize(
            "p2",
            "",
            "sizes3",
            "r3",
            vec![string("mode", "linear"), string("coordinate_transformation_mode", "align_corners")],
        ),
        node("Pad", &["r3", "pads3", "value"], "y", vec![]),
    ];
    let init = vec![
        int64s("sizes1", &[2, 3, 11, 5]),
        int64s("pads1", &[0, 0, 2, 1, 0, 0, 1, 3]),
        floats("scales2", &[1.0, 1.0, 1.5, 2.0]),
        int64s("pads2", &[0, 0, 1, 0, 0, 0, 0, 2]),
        int64s("sizes3", &[2, 3, 9, 13]),
        int64s("pads3", &[0, 0, 0, 2, 0, 0, 1, 1]),
        // A scalar, as Pad's constant_value is.
        tract_onnx::pb::TensorProto { dims: vec![], ..floats("value", &[0.75]) },
    ];
    write_model(dir, "resizes", &[2, 3, 7, 9], nodes, init)
}

/// Transposed convolutions at awkward sizes: groups, unequal strides, dilation, asymmetric
/// pads and output_padding; then `auto_pad` SAME_UPPER; then asymmetric pads at stride 1
/// (`output_shape` is ONNX's own node cases': tract panics on it).
fn upconvs(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node(
            "ConvTranspose",
            &["x", "w1", "b1"],
            "u1",
            vec![
                int("group", 2),
                ints("strides", &[2, 3]),
                ints("dilations", &[1, 2]),
                ints("pads", &[1, 0, 0, 2]),
                ints("output_padding", &[1, 1]),
            ],
        ),
        node(
            "ConvTranspose",
            &["u1", "w2"],
            "u2",
            vec![ints("strides", &[2, 2]), string("auto_pad", "SAME_UPPER")],
        ),
        node(
            "ConvTranspose",
            &["u2", "w3"],
            "y",
            vec![ints("strides", &[1, 1]), ints("pads", &[0, 1, 1, 0])],
        ),
    ];
    let init = vec![
        weight("w1", &[4, 3, 3, 3], 51, -0.5, 1.0),
        weight("b1", &[6], 52, -0.2, 0.4),
        weight("w2", &[6, 2, 3, 3], 53, -0.5, 1.0),
        weight("w3", &[2, 3, 3, 2], 54, -0.5, 1.0),
    ];
    write_model(dir, "upconvs", &[2, 4, 5, 6], nodes, init)
}

/// Every piecewise activation (`activations.rs`) but `Celu` on the same awkward image `x·4`
/// (values spread across each one's break points), attributes away from their defaults where
/// they have them, the branches added up. (tract's `Celu` is not ONNX's — ONNX Runtime and the
/// ONNX package's node cases agree with fusec's — so it is checked against its definition.)
fn activations(dir: &Path) -> std::path::PathBuf {
    let branches: Vec<(&str, Vec<AttributeProto>)> = vec![
        ("LeakyRelu", vec![float("alpha", 0.15)]),
        ("Elu", vec![float("alpha", 0.7)]),
        ("Selu", vec![float("alpha", 1.5), float("gamma", 1.1)]),
        ("ThresholdedRelu", vec![float("alpha", 0.4)]),
        ("Softsign", vec![]),
        ("Shrink", vec![float("bias", 0.25), float("lambd", 0.6)]),
    ];
    let mut nodes = vec![node("Mul", &["x", "four"], "spread", vec![])];
    nodes.push(node("PRelu", &["spread", "slope"], "a0", vec![]));
    for (i, (op, attributes)) in branches.into_iter().enumerate() {
        nodes.push(node(op, &["spread"], &format!("b{i}"), attributes));
        let sum = if i == 5 { "y".to_string() } else { format!("a{}", i + 1) };
        nodes.push(node("Add", &[&format!("a{i}"), &format!("b{i}")], &sum, vec![]));
    }
    let init = vec![weight("four", &[1], 1, 4.0, 0.0), weight("slope", &[5, 1, 1], 2, -0.5, 0.8)];
    write_model(dir, "activations", &[2, 5, 7, 9], nodes, init)
}

fn random_feeds(
    path: &Path,
    seed: u64,
) -> (fusec::import::Model, HashMap<String, ir::Tensor>, Vec<ir::Tensor>) {
    let model = import(path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let inputs = common::random_inputs(&model, seed);
    let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
    let values = inputs.into_iter().map(|(_, t)| t).collect();
    (model, feeds, values)
}

fn check(path: &Path) {
    let (model, feeds, values) = random_feeds(path, 7);
    let theirs = run_tract(path, &values).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        theirs[0].to_f64_vec().iter().any(|&v| v != 0.0),
        "{}: the reference is all zeros",
        path.display()
    );
    let ours = ir::evaluate(&model.graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= TOLERANCE, "{}: imported, rel-L2 {err:e}", path.display());
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    let fused = fusion::fuse(&graph, &FusionLimits::default()).unwrap_or_else(|e| panic!("{e}"));
    let after = ir::evaluate(&fused.graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&after[0].1, &theirs[0]);
    assert!(err <= TOLERANCE, "{}: fused, rel-L2 {err:e}", path.display());
    for no_fuse in [false, true] {
        let options = CompileOptions { no_fuse, ..Default::default() };
        plan_reporting(path, &options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn a_cnn_block_matches_tract() {
    let dir = tempfile::tempdir().unwrap();
    check(&cnn_block(dir.path()));
}

#[test]
fn pools_at_awkward_shapes_match_tract() {
    let dir = tempfile::tempdir().unwrap();
    check(&pools(dir.path()));
}

#[test]
fn resizes_and_pads_at_awkward_shapes_match_tract() {
    let dir = tempfile::tempdir().unwrap();
    check(&resizes(dir.path()));
}

#[test]
fn piecewise_activations_match_tract() {
    let dir = tempfile::tempdir().unwrap();
    check(&activations(dir.path()));
}

/// `Celu` against its definition, `max(0, x) + min(0, α·(e^(x/α) − 1))`, in f64.
#[test]
fn celu_follows_its_definition() {
    let dir = tempfile::tempdir().unwrap();
    let alpha = 1.3f64;
    let nodes = vec![
        node("Mul", &["x", "four"], "spread", vec![]),
        node("Celu", &["spread"], "y", vec![float("alpha", alpha as f32)]),
    ];
    let path = write_model(dir.path(), "celu", &[3, 7, 5], nodes, vec![weight("four", &[1], 1, 4.0, 0.0)]);
    let (model, feeds, values) = random_feeds(&path, 3);
    let ours = ir::evaluate(&model.graph, &feeds).unwrap();
    let x: Vec<f64> = values[0].to_f64_vec().iter().map(|v| f64::from(*v as f32 * 4.0)).collect();
    assert!(x.iter().any(|&v| v < -1.0) && x.iter().any(|&v| v > 1.0), "values on both sides");
    let expected: Vec<f64> =
        x.iter().map(|&v| v.max(0.0) + (alpha * ((v / alpha).exp() - 1.0)).min(0.0)).collect();
    let expected = ir::Tensor::from_f64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[3, 7, 5]), expected).unwrap(),
        DType::F64,
    );
    let err = rel_l2(&ours[0].1, &expected);
    assert!(err <= 1e-6, "rel-L2 {err:e}");
}

#[test]
fn transposed_convolutions_match_tract() {
    let dir = tempfile::tempdir().unwrap();
    check(&upconvs(dir.path()));
}

/// Negative pads crop (tract panics on them, so against values written out): a 3×4 image
/// cropped by one row at the top and two columns on the right, then padded by one row below
/// and one column on the left with the value 9.
#[test]
fn negative_pads_crop() {
    let dir = tempfile::tempdir().unwrap();
    let pad = node("Pad", &["x", "pads", "value"], "y", vec![]);
    let init = vec![
        int64s("pads", &[0, 0, -1, 1, 0, 0, 1, -2]),
        tract_onnx::pb::TensorProto { dims: vec![], ..floats("value", &[9.0]) },
    ];
    let path = write_model(dir.path(), "crop", &[1, 1, 3, 4], vec![pad], init);
    let model = import(&path, &ImportOptions::default()).unwrap();
    let x = ir::Tensor::from_f64(
        ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[1, 1, 3, 4]), |i| (i[2] * 4 + i[3]) as f64),
        DType::F32,
    );
    let feeds = HashMap::from([("x".to_string(), x)]);
    let y = &ir::evaluate(&model.graph, &feeds).unwrap()[0].1;
    assert_eq!(y.shape(), &[1, 1, 3, 3]);
    assert_eq!(y.to_f64_vec(), [9.0, 4.0, 5.0, 9.0, 8.0, 9.0, 9.0, 9.0, 9.0]);
}

/// BatchNormalization's statistics fold into one scale and one shift per channel: the
/// imported graph of a convolution and its normalisation has no Sqrt or Div left.
#[test]
fn batch_norm_folds_to_a_scale_and_a_shift() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = random_feeds(&cnn_block(dir.path()), 1);
    let ops = model.graph.op_histogram();
    assert!(!ops.contains_key("Sqrt") && !ops.contains_key("Div"), "{ops:?}");
}

/// The convolution and its BatchNormalization become one convolution (new weights and
/// bias) in the passes, and the model keeps its meaning ([`check`] runs the passes).
#[test]
fn batch_norm_folds_into_the_convolution() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = random_feeds(&cnn_block(dir.path()), 1);
    let mut graph = model.graph.clone();
    let report = run_passes(&mut graph, &standard()).unwrap();
    assert!(report.contains(&("fold-conv-affine", 2)), "{report:?}");
    let conv = graph.node_ids().find(|&id| graph.node(id).op.kind() == "Conv").unwrap();
    for user in graph.users_of(conv) {
        let op = &graph.node(user).op;
        let per_channel =
            graph.inputs_of(user).iter().any(|&i| graph.constant(i).is_some_and(|c| c.len() > 1));
        assert!(
            !(op.is_pointwise() && per_channel),
            "a per-channel {} is left after the convolution",
            op.kind()
        );
    }
}

/// A second output of MaxPool (the indices) and training-mode BatchNormalization are refused
/// with the node named, not computed wrongly.
#[test]
fn outputs_the_ops_cannot_give_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut with_indices = node("MaxPool", &["x"], "y", vec![ints("kernel_shape", &[2, 2])]);
    with_indices.output.push("indices".into());
    let path = write_model(dir.path(), "indices", &[1, 2, 5, 5], vec![with_indices], vec![]);
    let err = import(&path, &ImportOptions::default()).unwrap_err().to_string();
    assert!(err.contains("MaxPool_y") && err.contains("Indices"), "{err}");
    let training = node("BatchNormalization", &["x", "s", "s", "s", "s"], "y", vec![int("training_mode", 1)]);
    let path = write_model(
        dir.path(),
        "training",
        &[1, 2, 5, 5],
        vec![training],
        vec![weight("s", &[2], 1, 0.5, 1.0)],
    );
    let err = import(&path, &ImportOptions::default()).unwrap_err().to_string();
    assert!(err.contains("BatchNormalization_y") && err.contains("training_mode"), "{err}");
}

/// Every kernel of both models, fused and unfused, in f32 and f16, compiles with NVRTC.
#[test]
fn every_kernel_compiles_with_nvrtc() {
    if !fusec::nvrtc::available() {
        println!("skipped: NVRTC not found (the kernels were generated by the other tests but not compiled)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let models = [
        cnn_block(dir.path()),
        pools(dir.path()),
        resizes(dir.path()),
        upconvs(dir.path()),
        activations(dir.path()),
    ];
    for path in models {
        for (no_fuse, precision) in [(false, DType::F32), (true, DType::F32), (false, DType::F16)] {
            let options = CompileOptions { no_fuse, precision, ..Default::default() };
            let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap();
            let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{e}"));
            let sources: Vec<_> = steps.iter().flat_map(fusec::codegen::Step::sources).collect();
            assert!(!sources.is_empty());
            for source in sources {
                fusec::nvrtc::compile(source, "sm_90")
                    .unwrap_or_else(|e| panic!("{} {precision} no_fuse={no_fuse}: {e}", path.display()));
            }
        }
    }
}

/// A convolution of static shape with symmetric padding in f32 is a cuDNN call with an
/// epilogue kernel for its bias (the ViT fixture's patch embedding); in f16 (channels-last)
/// that patch embedding is a GEMM over the image's patches; one with asymmetric padding, or
/// in bf16, stays a generated loop.
#[test]
fn convolutions_go_to_cudnn_where_it_takes_them() {
    use fusec::codegen::Step;
    let vit = common::model_path("vit_ts.onnx");
    let import = ImportOptions::default().dim("batch", 2);
    for (precision, library) in [(DType::F32, true), (DType::F16, false), (DType::BF16, false)] {
        let options = CompileOptions { import: import.clone(), precision, ..Default::default() };
        let (plan, _) = plan_reporting(&vit, &options, &mut |_| {}).unwrap();
        let steps = fusec::codegen::generate(&plan).unwrap();
        let convs: Vec<_> = steps.iter().filter(|s| matches!(s, Step::Conv { .. })).collect();
        assert_eq!(convs.len(), usize::from(library), "{precision}");
        if precision == DType::F16 {
            let gemms = steps.iter().filter(|s| matches!(s, Step::Gemm { .. })).count();
            assert_eq!(gemms, 9, "the patch embedding and the two layers' 4 GEMMs each (q, k, v merged)");
        }
        if let Some(Step::Conv { conv, epilogue }) = convs.first() {
            // Patches: the stride is the kernel's size.
            assert_eq!(
                (conv.strides, conv.pads, conv.group),
                ([conv.w_shape[2], conv.w_shape[3]], [0, 0], 1)
            );
            assert_eq!(conv.dtype, precision);
            assert!(epilogue.is_some(), "the bias runs in an epilogue kernel");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (plan, _) = plan_reporting(&cnn_block(dir.path()), &CompileOptions::default(), &mut |_| {}).unwrap();
    let steps = fusec::codegen::generate(&plan).unwrap();
    assert!(!steps.iter().any(|s| matches!(s, Step::Conv { .. })), "asymmetric padding stays a loop");
}

/// A convolution followed by SiLU (`x·σ(x)`) and a depthwise one followed by HardSwish
/// (`x·HardSigmoid(x)`): each activation reads the convolution's result twice, and joins the
/// convolution's kernel whole (one output), in every precision; the values stay tract's.
#[test]
fn an_activation_reading_a_convolution_twice_joins_its_kernel() {
    use fusec::fusion::KernelKind;
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        node("Conv", &["x", "w1", "b1"], "c1", vec![ints("pads", &[1, 1, 1, 1])]),
        node("Sigmoid", &["c1"], "s1", vec![]),
        node("Mul", &["c1", "s1"], "a1", vec![]),
        node("Conv", &["a1", "w2", "b2"], "c2", vec![ints("pads", &[1, 1, 1, 1]), int("group", 6)]),
        node("HardSwish", &["c2"], "y", vec![]),
    ];
    let init = vec![
        weight("w1", &[6, 3, 3, 3], 1, -0.4, 0.8),
        weight("b1", &[6], 2, -0.2, 0.4),
        weight("w2", &[6, 1, 3, 3], 3, -0.5, 1.0),
        weight("b2", &[6], 4, -0.3, 0.6),
    ];
    let path = write_model(dir.path(), "activated", &[2, 3, 9, 11], nodes, init);
    check(&path);
    for precision in [DType::F32, DType::F16] {
        let options = CompileOptions { precision, ..Default::default() };
        let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap();
        let convs: Vec<_> = plan.kernels.iter().filter(|k| k.kind == KernelKind::Conv).collect();
        assert_eq!(convs.len(), 2, "{precision}");
        for conv in convs {
            let ops: Vec<String> = conv.nodes.iter().map(|&n| plan.graph.node(n).op.kind()).collect();
            assert!(
                ops.iter().any(|o| o == "Mul"),
                "{precision}: the activation is in the convolution's kernel: {ops:?}"
            );
            assert_eq!(conv.outputs.len(), 1, "{precision}: {ops:?}");
        }
        assert!(
            !plan.kernels.iter().any(|k| k.kind == KernelKind::Pointwise
                && k.nodes.iter().any(|&n| plan.graph.node(n).op.kind() == "Mul")),
            "{precision}: no activation kernel of its own"
        );
    }
}

/// A stem convolution and max pool, a residual block (conv, BN, ReLU, depthwise conv, conv, BN, add of the skip through
/// a 1×1 convolution, ReLU), a squeeze-and-excitation gate (global pool, 1×1 convolution,
/// sigmoid, scale), then the global average pool: symmetric padding throughout, so every
/// convolution goes channels-last.
fn residual_block(dir: &Path) -> std::path::PathBuf {
    let conv =
        |x: &str, w: &str, b: &str, y: &str| node("Conv", &[x, w, b], y, vec![ints("pads", &[1, 1, 1, 1])]);
    let bn = |x: &str, p: &str, y: &str| {
        let names: Vec<String> =
            ["scale", "shift", "mean", "var"].iter().map(|s| format!("{p}_{s}")).collect();
        node("BatchNormalization", &[x, &names[0], &names[1], &names[2], &names[3]], y, vec![])
    };
    let nodes = vec![
        node("Conv", &["x", "w0", "b0"], "c0", vec![ints("pads", &[1, 1, 1, 1]), ints("strides", &[2, 2])]),
        node("Relu", &["c0"], "r", vec![]),
        node(
            "MaxPool",
            &["r"],
            "r0",
            vec![ints("kernel_shape", &[3, 3]), ints("strides", &[2, 2]), ints("pads", &[1, 1, 1, 1])],
        ),
        conv("r0", "w1", "b1", "c1"),
        bn("c1", "bn1", "n1"),
        node("Relu", &["n1"], "r1", vec![]),
        node("Conv", &["r1", "wd"], "d1", vec![ints("pads", &[1, 1, 1, 1]), int("group", 8)]),
        conv("d1", "w2", "b2", "c2"),
        bn("c2", "bn2", "n2"),
        node("Conv", &["r0", "w3", "b3"], "skip", vec![]),
        node("Add", &["n2", "skip"], "sum", vec![]),
        node("Relu", &["sum"], "r2", vec![]),
        node("GlobalAveragePool", &["r2"], "squeezed", vec![]),
        node("Conv", &["squeezed", "w4", "b4"], "excited", vec![]),
        node("Sigmoid", &["excited"], "gate", vec![]),
        node("Mul", &["r2", "gate"], "scaled", vec![]),
        node("GlobalAveragePool", &["scaled"], "y", vec![]),
    ];
    let mut init = vec![
        weight("w0", &[8, 3, 3, 3], 11, -0.5, 1.0),
        weight("b0", &[8], 12, -0.2, 0.4),
        weight("w1", &[8, 8, 3, 3], 13, -0.3, 0.6),
        weight("b1", &[8], 14, -0.2, 0.4),
        weight("w2", &[8, 8, 3, 3], 15, -0.3, 0.6),
        weight("b2", &[8], 16, -0.2, 0.4),
        weight("w3", &[8, 8, 1, 1], 17, -0.3, 0.6),
        weight("b3", &[8], 18, -0.2, 0.4),
        weight("w4", &[8, 8, 1, 1], 19, -0.3, 0.6),
        weight("wd", &[8, 1, 3, 3], 31, -0.5, 1.0),
        weight("b4", &[8], 30, -0.2, 0.4),
    ];
    for (k, p) in ["bn1", "bn2"].iter().enumerate() {
        let seed = 20 + 4 * k as u64;
        init.push(weight(&format!("{p}_scale"), &[8], seed, 0.5, 1.0));
        init.push(weight(&format!("{p}_shift"), &[8], seed + 1, -0.3, 0.6));
        init.push(weight(&format!("{p}_mean"), &[8], seed + 2, -0.2, 0.4));
        init.push(weight(&format!("{p}_var"), &[8], seed + 3, 0.2, 1.5));
    }
    write_model(dir, "residual_block", &[2, 3, 17, 15], nodes, init)
}

/// The layout pass keeps the model's meaning (against tract) and leaves no transpose between
/// two convolutions of a residual block: the input is transposed once for the first, the
/// pooled result once at the end, and everything between stays NHWC (the gate's pool too);
/// the 1×1 convolutions are GEMMs.
#[test]
fn channels_last_leaves_no_transpose_between_convolutions() {
    use fusec::passes::{ChannelsLast, Pass, SplitReductions};
    let dir = tempfile::tempdir().unwrap();
    let path = residual_block(dir.path());
    let (model, feeds, values) = random_feeds(&path, 3);
    let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    assert!(ChannelsLast.run(&mut graph).unwrap() > 0);
    ir::verify(&graph).unwrap();
    // Both global pools (over NHWC's axes 1 and 2) become one reduction per axis.
    assert_eq!(SplitReductions.run(&mut graph).unwrap(), 2);
    ir::verify(&graph).unwrap();
    let ours = ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= TOLERANCE, "channels-last: rel-L2 {err:e}");
    let kinds: Vec<(String, String)> = graph
        .node_ids()
        .map(|id| {
            (
                graph.node(id).op.to_string(),
                graph.inputs_of(id).first().map(|&i| graph.node(i).op.kind()).unwrap_or_default(),
            )
        })
        .collect();
    let convs = kinds.iter().filter(|(op, _)| op.starts_with("Conv") && op.contains("NHWC")).count();
    assert_eq!(convs, 4, "{kinds:?}");
    assert!(kinds.iter().any(|(op, _)| op.starts_with("MaxPool") && op.contains("NHWC")), "{kinds:?}");
    let matmuls: Vec<&(String, String)> = kinds.iter().filter(|(op, _)| op == "MatMul").collect();
    assert_eq!(matmuls.len(), 2, "{kinds:?}");
    assert!(matmuls.iter().all(|(_, input)| input != "Transpose"), "{kinds:?}");
    // The depthwise filters are stored tap-major and read through a transpose.
    let all: Vec<&(String, String)> = kinds.iter().filter(|(op, _)| op.starts_with("Transpose")).collect();
    let filters: Vec<_> = all.iter().filter(|(_, input)| input == "Constant").collect();
    let transposes: Vec<_> = all.iter().filter(|(_, input)| input != "Constant").collect();
    assert_eq!(filters.len(), 1, "{filters:?}");
    assert_eq!(transposes.len(), 2, "{transposes:?}");
    assert!(transposes.iter().any(|(_, input)| input == "Input"), "{transposes:?}");
    // Compiled in f16 with the pass asked for, every convolution but the depthwise one is a
    // channels-last cuDNN call and every kernel compiles.
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap();
    let steps = fusec::codegen::generate(&plan).unwrap();
    let library: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            fusec::codegen::Step::Conv { conv, .. } => Some(conv.channels_last),
            _ => None,
        })
        .collect();
    assert_eq!(library, [true, true, true]);
    // Each convolution's epilogue is one cuDNN's fused form can run: the stem's bias and
    // ReLU, the first block convolution's (BatchNormalization folded) bias and ReLU, the
    // second's bias; the sum and ReLU go with the skip path's 1×1 convolution, a GEMM that
    // follows the second convolution (cuBLASLt's residual, below).
    let fused: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            fusec::codegen::Step::Conv { conv, .. } => {
                Some(conv.fused.map(|f| (f.residual.is_some(), f.relu)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(fused, [Some((false, true)), Some((false, true)), Some((false, false))], "{fused:?}");
    let gemms: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            fusec::codegen::Step::Gemm { gemm, .. } => {
                Some(gemm.lt_epilogue.map(|e| (e.residual.is_some(), e.activation)))
            }
            _ => None,
        })
        .collect();
    use fusec::codegen::LtActivation;
    assert_eq!(
        gemms,
        [Some((true, LtActivation::Relu)), None],
        "the 1×1 convolutions run as GEMMs, the skip path's with the sum and ReLU (the gate's sigmoid is an epilogue kernel)"
    );
    // The depthwise convolution is the one generated convolution kernel: its threads take
    // 8 channels of 4 columns each, reading each input row's columns once as packs (zeros
    // in the padding) and each tap's filters as one pack.
    let loops: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            fusec::codegen::Step::Launch(k) if k.source.contains(": conv\n") => Some(k),
            _ => None,
        })
        .collect();
    assert_eq!(loops.len(), 1, "{:?}", loops.iter().map(|k| &k.name).collect::<Vec<_>>());
    let source = &loops[0].source;
    let packs = source.matches("reinterpret_cast<const fusec::Pack<__half, 8>*>").count();
    let tiled = source.contains("load_or_zero") && source.contains("4 columns per thread");
    assert!(packs == 2 && tiled && source.contains("float dw"), "{source}");
    if fusec::nvrtc::available() {
        for source in steps.iter().flat_map(fusec::codegen::Step::sources) {
            fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A bf16 build takes the same path as an f16 one: every convolution but the depthwise one a
/// channels-last cuDNN call in bf16 (they were all generated loops), the 1×1 ones GEMMs, and
/// every kernel compiles. The image's three channels are padded to 16 in bf16 (cuDNN's NHWC
/// bf16 kernels for 8 were slow), to 8 in f16.
#[test]
fn bf16_convolutions_run_channels_last_on_cudnn() {
    let dir = tempfile::tempdir().unwrap();
    let path = residual_block(dir.path());
    let convs = |precision: DType| {
        let options = CompileOptions { precision, channels_last: true, ..Default::default() };
        let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap();
        let steps = fusec::codegen::generate(&plan).unwrap();
        let convs: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                fusec::codegen::Step::Conv { conv, .. } => {
                    Some((conv.dtype, conv.channels_last, conv.x_shape[1]))
                }
                _ => None,
            })
            .collect();
        (steps, convs)
    };
    let (_, half) = convs(DType::F16);
    assert_eq!(half, [(DType::F16, true, 8), (DType::F16, true, 8), (DType::F16, true, 8)]);
    let (steps, library) = convs(DType::BF16);
    assert_eq!(library, [(DType::BF16, true, 16), (DType::BF16, true, 8), (DType::BF16, true, 8)]);
    let gemms = steps.iter().filter(|s| matches!(s, fusec::codegen::Step::Gemm { .. })).count();
    assert_eq!(gemms, 2, "the 1×1 convolutions run as GEMMs");
    let loops = steps
        .iter()
        .filter(|s| matches!(s, fusec::codegen::Step::Launch(k) if k.source.contains(": conv\n")))
        .count();
    assert_eq!(loops, 1, "only the depthwise convolution is a generated loop");
    if fusec::nvrtc::available() {
        for source in steps.iter().flat_map(fusec::codegen::Step::sources) {
            fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A patch embedding (a 4×4 window of stride 4, as a vision transformer's) goes channels-last
/// as a GEMM over the image's patches: no convolution is left, its image channels are not
/// padded, and the rewritten graph matches tract.
#[test]
fn a_patch_embedding_becomes_a_gemm() {
    use fusec::passes::{ChannelsLast, Pass};
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![node(
        "Conv",
        &["x", "w", "b"],
        "y",
        vec![ints("strides", &[4, 4]), ints("kernel_shape", &[4, 4])],
    )];
    let init = vec![weight("w", &[16, 3, 4, 4], 41, -0.5, 1.0), weight("b", &[16], 42, -0.2, 0.4)];
    let path = write_model(dir.path(), "patches", &[2, 3, 12, 8], nodes, init);
    let (model, feeds, values) = random_feeds(&path, 5);
    let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    assert!(ChannelsLast.run(&mut graph).unwrap() > 0);
    ir::verify(&graph).unwrap();
    let ops: Vec<String> = graph.node_ids().map(|id| graph.node(id).op.kind().to_string()).collect();
    assert!(!ops.iter().any(|op| op == "Conv" || op == "Concat"), "{ops:?}");
    assert_eq!(ops.iter().filter(|op| *op == "MatMul").count(), 1, "{ops:?}");
    let ours = ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= TOLERANCE, "patches: rel-L2 {err:e}");
    // In f16 the image's cast runs over the patches' layout: whole packs stored, the image's
    // rows read in runs of four.
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    let (plan, _) = plan_reporting(&path, &options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{e}"));
    let cast = steps.iter().flat_map(fusec::codegen::Step::sources).next().expect("a kernel");
    let packed = cast.source.contains("*reinterpret_cast<fusec::Pack<__half, 8>*>(out0");
    assert!(packed && !cast.source.contains("out0[("), "{}", cast.source);
}

/// A ConvNeXt block whose layer scale is uniform (stored as a broadcast of one element, as
/// every uniform initializer is): the channels-last pass moves the transposes past the scale
/// and the residual add as it does past a constant, so nothing between the two depthwise
/// convolutions is transposed, and the rewritten graph matches tract.
#[test]
fn a_uniform_layer_scale_keeps_the_block_channels_last() {
    use fusec::passes::{ChannelsLast, Pass};
    let dir = tempfile::tempdir().unwrap();
    let depthwise = |x: &str, w: &str, y: &str| {
        node("Conv", &[x, w], y, vec![ints("pads", &[3, 3, 3, 3]), int("group", 16)])
    };
    let nodes = vec![
        node("Conv", &["x", "ws"], "s", vec![ints("pads", &[1, 1, 1, 1])]),
        depthwise("s", "wd", "d"),
        node("Transpose", &["d"], "t", vec![ints("perm", &[0, 2, 3, 1])]),
        node("MatMul", &["t", "w1"], "m1", vec![]),
        node("Relu", &["m1"], "h", vec![]),
        node("MatMul", &["h", "w2"], "m2", vec![]),
        node("Transpose", &["m2"], "back", vec![ints("perm", &[0, 3, 1, 2])]),
        // The TorchScript exporter reads shared parameters through `Identity` nodes; a
        // folded uniform value is kept as a broadcast of one element.
        node("Identity", &["gamma_init"], "gamma", vec![]),
        node("Mul", &["gamma", "back"], "scaled", vec![]),
        node("Add", &["scaled", "s"], "sum", vec![]),
        depthwise("sum", "wd2", "y"),
    ];
    let mut init = vec![
        weight("ws", &[16, 16, 3, 3], 70, -0.3, 0.6),
        weight("wd", &[16, 1, 7, 7], 71, -0.3, 0.6),
        weight("w1", &[16, 32], 72, -0.5, 1.0),
        weight("w2", &[32, 16], 73, -0.5, 1.0),
        weight("wd2", &[16, 1, 7, 7], 74, -0.3, 0.6),
    ];
    init.push(weight("gamma_init", &[16, 1, 1], 75, 0.25, 0.0));
    let path = write_model(dir.path(), "layer_scale", &[2, 16, 9, 7], nodes, init);
    let (model, feeds, values) = random_feeds(&path, 3);
    let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    let scale = graph.node_ids().find(|&n| graph.node(n).op.kind() == "Mul").unwrap();
    let inputs: Vec<String> = graph.inputs_of(scale).iter().map(|&i| graph.node(i).op.kind()).collect();
    assert!(inputs.contains(&"Expand".to_string()), "the uniform scale is a broadcast: {inputs:?}");
    assert!(ChannelsLast.run(&mut graph).unwrap() > 0);
    ir::verify(&graph).unwrap();
    graph.remove_unused();
    let transposes: Vec<String> = graph
        .node_ids()
        .filter(|&n| graph.node(n).op.kind() == "Transpose")
        .map(|n| graph.inputs_of(n).iter().map(|&i| graph.node(i).op.kind()).collect::<Vec<_>>().join(","))
        .collect();
    // The image in, the result out, the depthwise filters (tap-major): nothing between the
    // stem and the last convolution.
    assert_eq!(transposes.len(), 4, "{transposes:?}");
    assert_eq!(transposes.iter().filter(|t| *t == "Constant").count(), 2, "{transposes:?}");
    let ours = ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= TOLERANCE, "layer scale: rel-L2 {err:e}");
}
