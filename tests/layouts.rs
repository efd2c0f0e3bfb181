//! Values stored and read through layout views as whole packs: a LayerNorm whose output is
//! stored with its rows transposed (a vision transformer's `[batch, seq, E]` into the
//! attention's `[seq, batch, E]`) and one reading rows so transposed; a ConvNeXt downsampling
//! (LayerNorm2d, then a 2×2 convolution of stride 2 as a GEMM over patches) whose LayerNorm
//! stores each pixel's channels together in the patches' rows; narrow rows (a LayerNorm over 96
//! channels, a softmax over 64) several to a warp; a nearest 2× upsampling and a DepthToSpace
//! read through by their consumers, no kernel of their own; a class token concatenated before
//! (and after) a GEMM's rows, each part loading its packs only where it is read. f16 programs; the rewritten
//! graph against tract on the CPU, every kernel through NVRTC where it is found, and the bundle
//! against tract on a GPU.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::onnx::{float, floats, int, int64s, ints, node, string, weight, write_model};
use fusec::codegen::{KernelSource, Step};
use fusec::ir::{self, rel_l2, DType, Tensor};
use fusec::passes::{run_passes, standard, ChannelsLast, Pass};
use fusec::pipeline::{plan_reporting, CompileOptions};

const HALF_TOLERANCE: f64 = 1e-2;

fn layer_norm(x: &str, y: &str) -> tract_onnx::pb::NodeProto {
    node("LayerNormalization", &[x, "g", "b"], y, vec![int("axis", -1), float("epsilon", 1e-6)])
}

/// MatMul, the residual add, LayerNorm, its rows transposed into a MatMul, that product's rows
/// transposed back, the residual add and LayerNorm again; batch 3 × 7 positions × 64.
fn transformer_rows(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "w"], "m", vec![]),
        node("Add", &["m", "x"], "r", vec![]),
        layer_norm("r", "y"),
        node("Transpose", &["y"], "yt", vec![ints("perm", &[1, 0, 2])]),
        node("MatMul", &["yt", "w"], "z", vec![]),
        node("Transpose", &["z"], "zt", vec![ints("perm", &[1, 0, 2])]),
        node("Add", &["zt", "r"], "r2", vec![]),
        layer_norm("r2", "out"),
    ];
    let init = vec![
        weight("w", &[64, 64], 61, -0.2, 0.4),
        weight("g", &[64], 62, 0.5, 1.0),
        weight("b", &[64], 63, -0.2, 0.4),
    ];
    write_model(dir, "rows", &[3, 7, 64], nodes, init)
}

/// A convolution (so the graph goes channels-last), LayerNorm2d as exported (to NHWC,
/// LayerNorm, back to NCHW), a 2×2 convolution of stride 2; batch 2, 32 channels at 10×6.
fn downsampling(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node("Conv", &["x", "w0"], "c", vec![ints("pads", &[1, 1, 1, 1])]),
        node("Transpose", &["c"], "t", vec![ints("perm", &[0, 2, 3, 1])]),
        layer_norm("t", "n"),
        node("Transpose", &["n"], "back", vec![ints("perm", &[0, 3, 1, 2])]),
        node(
            "Conv",
            &["back", "w1", "b1"],
            "out",
            vec![ints("strides", &[2, 2]), ints("kernel_shape", &[2, 2])],
        ),
    ];
    let init = vec![
        weight("w0", &[32, 32, 3, 3], 71, -0.1, 0.2),
        weight("g", &[32], 72, 0.5, 1.0),
        weight("b", &[32], 73, -0.2, 0.4),
        weight("w1", &[48, 32, 2, 2], 74, -0.2, 0.4),
        weight("b1", &[48], 75, -0.1, 0.2),
    ];
    write_model(dir, "downsampling", &[2, 32, 10, 6], nodes, init)
}

/// The f16 channels-last program's generated kernels (each through NVRTC where it is found).
fn kernels(path: &Path) -> Vec<KernelSource> {
    let steps = common::compiled_steps(path, &half());
    steps.iter().flat_map(Step::sources).cloned().collect()
}

fn half() -> CompileOptions {
    CompileOptions { precision: DType::F16, channels_last: true, ..Default::default() }
}

/// Element-at-a-time accesses of a kernel's buffers (`in3[`, `out0[`): none where every
/// access is a pack.
fn scalar_accesses(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in ["in", "out"] {
        for (at, _) in source.match_indices(prefix) {
            let rest = &source[at + prefix.len()..];
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            let boundary = at == 0 || !source.as_bytes()[at - 1].is_ascii_alphanumeric();
            if boundary && digits > 0 && rest[digits..].starts_with('[') {
                found.push(source[at..at + prefix.len() + digits + 1].to_string());
            }
        }
    }
    found
}

/// The f16 program on the GPU against tract, where a driver is found.
fn on_the_gpu(path: &Path, theirs: &[Tensor], inputs: &[(String, Tensor)]) {
    common::gpu_matches_tract(path, &half(), inputs, theirs, HALF_TOLERANCE);
}

#[test]
fn transposed_rows_are_stored_and_read_as_packs() {
    let dir = tempfile::tempdir().unwrap();
    let path = transformer_rows(dir.path());
    let rows: Vec<_> = kernels(&path).into_iter().filter(|k| k.source.contains(": row:LayerNorm")).collect();
    assert_eq!(rows.len(), 2, "{:?}", rows.iter().map(|k| &k.name).collect::<Vec<_>>());
    for kernel in &rows {
        let scalars = scalar_accesses(&kernel.source);
        assert!(scalars.is_empty(), "{}: {scalars:?}\n{}", kernel.name, kernel.source);
    }
    let (_, inputs, theirs) = common::tract_on_random_inputs(&path, 3);
    on_the_gpu(&path, &theirs, &inputs);
}

#[test]
fn a_downsampling_layer_norm_stores_pixels_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = downsampling(dir.path());
    let norms: Vec<_> = kernels(&path).into_iter().filter(|k| k.source.contains(": row:LayerNorm")).collect();
    assert_eq!(norms.len(), 1, "{:?}", norms.iter().map(|k| &k.name).collect::<Vec<_>>());
    let scalars = scalar_accesses(&norms[0].source);
    assert!(scalars.is_empty(), "{scalars:?}\n{}", norms[0].source);

    // The channels-last graph against tract: the patches' rows in [R, S, C] order, the
    // filters reordered to match.
    let (model, inputs, theirs) = common::tract_on_random_inputs(&path, 4);
    let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    assert!(ChannelsLast.run(&mut graph).unwrap() > 0);
    ir::verify(&graph).unwrap();
    let ops: Vec<String> = graph.node_ids().map(|id| graph.node(id).op.kind().to_string()).collect();
    assert_eq!(ops.iter().filter(|op| *op == "MatMul").count(), 1, "{ops:?}");
    let ours = ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= 1e-5, "channels-last graph: rel-L2 {err:e}");
    on_the_gpu(&path, &theirs, &inputs);
}

/// LayerNorm over 96 channels, a MatMul to 64, softmax; 4 × 8 rows.
fn narrow_rows(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        layer_norm("x", "n"),
        node("MatMul", &["n", "w"], "m", vec![]),
        node("Softmax", &["m"], "out", vec![int("axis", -1)]),
    ];
    let init = vec![
        weight("g", &[96], 81, 0.5, 1.0),
        weight("b", &[96], 82, -0.2, 0.4),
        weight("w", &[96, 64], 83, -0.3, 0.6),
    ];
    write_model(dir, "narrow", &[4, 8, 96], nodes, init)
}

#[test]
fn narrow_rows_share_a_warp() {
    let dir = tempfile::tempdir().unwrap();
    let path = narrow_rows(dir.path());
    let sources = kernels(&path);
    let find = |kind: &str| {
        sources.iter().find(|k| k.source.contains(kind)).unwrap_or_else(|| panic!("no {kind} kernel"))
    };
    // 96 halves are 12 packs of 8: 16 lanes a row, two rows a warp; the softmax's 64 (its f32
    // output in packs of 4) are 16 packs: 16 lanes too.
    let norm = find(": row:LayerNorm");
    assert!(norm.source.contains("fusec::lanes_sum<16>("), "{}", norm.source);
    assert!(!norm.source.contains("fusec::warp_sum(acc"), "{}", norm.source);
    let softmax = find(": row:Softmax");
    assert!(softmax.source.contains("fusec::lanes_max<16>("), "{}", softmax.source);
    let (_, inputs, theirs) = common::tract_on_random_inputs(&path, 5);
    on_the_gpu(&path, &theirs, &inputs);
}

/// A nearest 2× upsampling (half-pixel, as PyTorch exports `Upsample(scale_factor=2)`), ReLU,
/// DepthToSpace of blocks of 2, sigmoid; batch 2, 16 channels at 5×7.
fn upsampling(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node(
            "Resize",
            &["x", "", "scales"],
            "r",
            vec![string("mode", "nearest"), string("coordinate_transformation_mode", "half_pixel")],
        ),
        node("Relu", &["r"], "a", vec![]),
        node("DepthToSpace", &["a"], "d", vec![int("blocksize", 2)]),
        node("Sigmoid", &["d"], "out", vec![]),
    ];
    let init = vec![floats("scales", &[1.0, 1.0, 2.0, 2.0])];
    write_model(dir, "upsampling", &[2, 16, 5, 7], nodes, init)
}

#[test]
fn an_upsampling_is_read_through_by_its_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let path = upsampling(dir.path());
    let (plan, _) = plan_reporting(&path, &half(), &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    // The upsampling and the ReLU in one kernel (a Gather per axis before), the DepthToSpace
    // and the sigmoid in the next.
    let kinds: Vec<String> = plan.kernels.iter().map(|k| k.kind.name()).collect();
    assert!(!kinds.iter().any(|k| k == "gather" || k == "copy"), "{kinds:?}");
    assert_eq!(kinds.len(), 3, "the input's cast, two pointwise kernels: {kinds:?}");
    let (model, inputs, theirs) = common::tract_on_random_inputs(&path, 6);
    let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
    let ours = ir::evaluate(&model.graph, &feeds).unwrap_or_else(|e| panic!("{e}"));
    let err = rel_l2(&ours[0].1, &theirs[0]);
    assert!(err <= 1e-6, "imported graph: rel-L2 {err:e}");
    kernels(&path);
    on_the_gpu(&path, &theirs, &inputs);
}

/// A vision transformer's class token: a learned `[1, 1, 64]` row expanded over the batch and
/// concatenated before the patch embeddings (a GEMM's rows) — and, to have a middle part, after
/// them — then the position embeddings added; batch 3 × 7 patches × 64.
fn class_token(dir: &Path) -> std::path::PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "w"], "patches", vec![]),
        node("Expand", &["cls", "shape"], "tokens", vec![]),
        node("Concat", &["tokens", "patches", "tokens"], "seq", vec![int("axis", 1)]),
        node("Add", &["seq", "pos"], "out", vec![]),
    ];
    let init = vec![
        weight("w", &[64, 64], 81, -0.2, 0.4),
        weight("cls", &[1, 1, 64], 82, -1.0, 2.0),
        int64s("shape", &[3, 1, 64]),
        weight("pos", &[1, 9, 64], 83, -0.5, 1.0),
    ];
    write_model(dir, "class_token", &[3, 7, 64], nodes, init)
}

#[test]
fn a_concatenation_loads_packs_only_where_each_part_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = class_token(dir.path());
    let concats: Vec<_> = kernels(&path).into_iter().filter(|k| k.source.contains(": concat")).collect();
    assert_eq!(concats.len(), 1, "{:?}", concats.iter().map(|k| &k.name).collect::<Vec<_>>());
    let source = &concats[0].source;
    let scalars = scalar_accesses(source);
    assert!(scalars.is_empty(), "{scalars:?}\n{source}");
    assert_eq!(source.matches("fusec::load_or_zero(").count(), 3, "each part's pack guarded:\n{source}");
    let (_, inputs, theirs) = common::tract_on_random_inputs(&path, 7);
    on_the_gpu(&path, &theirs, &inputs);
}
