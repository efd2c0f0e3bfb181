//! Depthwise convolutions with large windows (7×7, 5×5) in f16 channels-last programs run as
//! the shared-memory tile kernel (`codegen::depthwise`) at awkward sizes — odd heights and
//! widths, stride 2, dilation 2, 32 to 160 channels — with a bias and SiLU in their epilogue;
//! a 3×3 and a 5×5 over 48 channels keep the generated loop.
//! Asymmetric pads (TensorFlow's SAME padding at stride 2) keep a depthwise convolution
//! channels-last (cuDNN, which takes only symmetric ones, never runs it). An f32 network runs
//! channels-last where it has a depthwise convolution, NCHW otherwise. Every kernel compiles
//! with NVRTC where it is found; on a GPU each model runs against tract.

mod common;

use std::path::Path;

use common::onnx::{int, ints, node, weight, write_model};
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

const HALF_TOLERANCE: f64 = 1e-2;

/// A depthwise convolution: `channels` at `size`, a square window, the same pad on every side,
/// the same stride and dilation along both axes.
struct Case {
    name: &'static str,
    channels: i64,
    size: [i64; 2],
    window: i64,
    pad: i64,
    stride: i64,
    dilation: i64,
}

const fn case(
    name: &'static str,
    channels: i64,
    size: [i64; 2],
    window: i64,
    pad: i64,
    stride: i64,
    dilation: i64,
) -> Case {
    Case { name, channels, size, window, pad, stride, dilation }
}

const CASES: [Case; 5] = [
    case("dw7", 96, [13, 11], 7, 3, 1, 1),
    case("dw5s2", 64, [17, 15], 5, 2, 2, 1),
    case("dw5d2", 160, [9, 12], 5, 4, 1, 2),
    case("dw5c48", 48, [10, 9], 5, 2, 1, 1),
    case("dw3", 32, [10, 9], 3, 1, 1, 1),
];

/// A depthwise convolution with a bias, then SiLU (`x · sigmoid(x)`); batch 3.
fn model(dir: &Path, case: &Case) -> std::path::PathBuf {
    let c = case.channels;
    let nodes = vec![
        node(
            "Conv",
            &["x", "w", "b"],
            "conv",
            vec![
                ints("kernel_shape", &[case.window, case.window]),
                ints("pads", &[case.pad; 4]),
                ints("strides", &[case.stride; 2]),
                ints("dilations", &[case.dilation; 2]),
                int("group", c),
            ],
        ),
        node("Sigmoid", &["conv"], "gate", vec![]),
        node("Mul", &["conv", "gate"], "y", vec![]),
    ];
    let init =
        vec![weight("w", &[c, 1, case.window, case.window], 91, -0.3, 0.6), weight("b", &[c], 92, -0.2, 0.4)];
    write_model(dir, case.name, &[3, c, case.size[0], case.size[1]], nodes, init)
}

#[test]
fn large_depthwise_windows_stage_their_tiles_in_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    for case in &CASES {
        let path = model(dir.path(), case);
        let steps = common::compiled_steps(&path, &options);
        let convs: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Launch(k) if k.source.contains(": conv\n") => Some(k),
                _ => None,
            })
            .collect();
        assert_eq!(convs.len(), 1, "{}: {:?}", case.name, convs.iter().map(|k| &k.name).collect::<Vec<_>>());
        let source = &convs[0].source;
        let shared = source.contains("__shared__ __align__(16) float dw_in");
        assert_eq!(shared, case.window >= 5 && case.channels % 32 == 0, "{}:\n{source}", case.name);
        if shared {
            // The SiLU is the tile kernel's epilogue: no kernel reads the convolution back.
            assert!(source.contains("fusec::sigmoid(v"), "{}:\n{source}", case.name);
        }
        let (_, inputs, theirs) = common::tract_on_random_inputs(&path, 9);
        common::gpu_matches_tract(&path, &options, &inputs, &theirs, HALF_TOLERANCE);
    }
}

/// A TensorFlow-style block: a depthwise 5×5 of stride 2 padded 1 before and 2 after (SAME on
/// an even size) over 64 channels, ReLU, a depthwise 3×3 of stride 2 padded 0 before and 1
/// after over the same; batch 2 at 18×14.
fn same_padded(dir: &Path) -> std::path::PathBuf {
    let depthwise = |x: &str, w: &str, y: &str, window: i64, pads: [i64; 4]| {
        node(
            "Conv",
            &[x, w],
            y,
            vec![
                ints("kernel_shape", &[window, window]),
                ints("pads", &pads),
                ints("strides", &[2, 2]),
                int("group", 64),
            ],
        )
    };
    let nodes = vec![
        depthwise("x", "w5", "a", 5, [1, 1, 2, 2]),
        node("Relu", &["a"], "r", vec![]),
        depthwise("r", "w3", "y", 3, [0, 0, 1, 1]),
    ];
    let init = vec![weight("w5", &[64, 1, 5, 5], 93, -0.3, 0.6), weight("w3", &[64, 1, 3, 3], 94, -0.3, 0.6)];
    write_model(dir, "same_padded", &[2, 64, 18, 14], nodes, init)
}

#[test]
fn asymmetric_pads_keep_depthwise_convolutions_channels_last() {
    use fusec::passes::{run_passes, standard, ChannelsLast, Pass};
    let dir = tempfile::tempdir().unwrap();
    let path = same_padded(dir.path());
    let options = CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() };
    let steps = common::compiled_steps(&path, &options);
    let convs: Vec<&str> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Launch(k) if k.source.contains(": conv\n") => Some(k.source.as_str()),
            _ => None,
        })
        .collect();
    // The 5×5 as the shared-memory tile kernel, the 3×3 as the NHWC loop over channel packs.
    assert_eq!(convs.len(), 2);
    assert!(convs[0].contains("float dw_in"), "{}", convs[0]);
    assert!(convs[1].contains("float dw") && !convs[1].contains("dw_in"), "{}", convs[1]);

    let (model, inputs, theirs) = common::tract_on_random_inputs(&path, 7);
    let feeds: std::collections::HashMap<_, _> = inputs.iter().cloned().collect();
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    assert!(ChannelsLast.run(&mut graph).unwrap() > 0);
    fusec::ir::verify(&graph).unwrap();
    let ours = fusec::ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = fusec::ir::rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= 1e-5, "channels-last graph: rel-L2 {err:e}");
    common::gpu_matches_tract(&path, &options, &inputs, &theirs, HALF_TOLERANCE);
}

/// In a program for ranges of sizes every kernel is launched scaled to the point it runs at: a
/// depthwise convolution whose shapes do not follow the range (a second input carries the
/// range) keeps the loop, never the tile kernel planned for one size.
#[test]
fn a_program_for_ranges_keeps_the_loop() {
    use prost::Message;
    use tract_onnx::pb::{tensor_shape_proto::dimension::Value, ModelProto, ValueInfoProto};
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        node("Conv", &["x", "w"], "a", vec![ints("pads", &[3, 3, 3, 3]), int("group", 64)]),
        node("Relu", &["t"], "b", vec![]),
    ];
    let path = write_model(
        dir.path(),
        "two",
        &[2, 64, 9, 9],
        nodes,
        vec![weight("w", &[64, 1, 7, 7], 95, -0.3, 0.6)],
    );
    // A second input `t` of [batch, 8], and both results as outputs.
    let mut model = ModelProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    let graph = model.graph.as_mut().unwrap();
    let mut t = common::onnx::value_info("t", &[1, 8]);
    let shape = t.r#type.as_mut().and_then(|ty| match ty.value.as_mut() {
        Some(tract_onnx::pb::type_proto::Value::TensorType(tensor)) => tensor.shape.as_mut(),
        _ => None,
    });
    shape.unwrap().dim[0].value = Some(Value::DimParam("batch".into()));
    graph.input.push(t);
    graph.output =
        ["a", "b"].iter().map(|&n| ValueInfoProto { name: n.into(), ..Default::default() }).collect();
    std::fs::write(&path, model.encode_to_vec()).unwrap();

    let dims = vec!["batch=1..4".parse().unwrap()];
    let options = CompileOptions {
        precision: DType::F16,
        import: fusec::import::ImportOptions::new(vec![], dims),
        ..Default::default()
    };
    let plan = fusec::pipeline::plan_range(&path, &options).unwrap_or_else(|e| panic!("{e}"));
    let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{e}"));
    let launches: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Launch(k) => Some(k),
            _ => None,
        })
        .collect();
    let conv = launches.iter().find(|k| k.source.contains(": conv\n")).expect("a convolution kernel");
    assert!(!conv.source.contains("dw_in"), "{}", conv.source);
    assert!(launches.iter().all(|k| k.scale.is_some()), "every launch follows the range");
}

/// In f32 a network runs channels-last where it has a depthwise convolution (which only the
/// generated NHWC kernels run well) and stays NCHW otherwise (`passes::channels_last::wanted`):
/// the 7×7 depthwise case takes the tile kernel in f32 too; a plain 3×3 convolution with a
/// global average pool after it keeps an NCHW cuDNN call, and the pool (over the last two
/// axes) is one row reduction over their run. Every kernel through NVRTC; on a GPU, both
/// against tract at f32's tolerance.
#[test]
fn f32_networks_go_channels_last_for_their_depthwise_convolutions() {
    let names =
        |steps: &[Step]| steps.iter().flat_map(Step::sources).map(|k| k.name.clone()).collect::<Vec<_>>();
    let dir = tempfile::tempdir().unwrap();
    let options = CompileOptions { precision: DType::F32, channels_last: true, ..Default::default() };
    let depthwise = model(dir.path(), &CASES[0]);
    let steps = common::compiled_steps(&depthwise, &options);
    let tile = steps.iter().any(|s| matches!(s, Step::Launch(k) if k.source.contains("float dw_in")));
    assert!(tile, "{:?}", names(&steps));
    let (_, inputs, theirs) = common::tract_on_random_inputs(&depthwise, 5);
    common::gpu_matches_tract(&depthwise, &options, &inputs, &theirs, 1e-5);

    let nodes = vec![
        node("Conv", &["x", "w", "b"], "conv", vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1; 4])]),
        node("Relu", &["conv"], "r", vec![]),
        node("GlobalAveragePool", &["r"], "y", vec![]),
    ];
    let init = vec![weight("w", &[24, 16, 3, 3], 96, -0.3, 0.6), weight("b", &[24], 97, -0.2, 0.4)];
    let plain = write_model(dir.path(), "plain", &[3, 16, 13, 11], nodes, init);
    let steps = common::compiled_steps(&plain, &options);
    let layouts: Vec<bool> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Conv { conv, .. } => Some(conv.channels_last),
            _ => None,
        })
        .collect();
    assert_eq!(layouts, [false], "{:?}", names(&steps));
    let reductions: Vec<&str> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Launch(k) if k.name.contains("reduce") => Some(k.source.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reductions.len(), 1, "{:?}", names(&steps));
    let (_, inputs, theirs) = common::tract_on_random_inputs(&plain, 6);
    common::gpu_matches_tract(&plain, &options, &inputs, &theirs, 1e-5);
}
