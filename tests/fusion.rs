//! Fusion on the fixtures: the fused graph keeps the model's meaning, every block is
//! recognised, and the partition launches few kernels.

mod common;

use std::collections::{BTreeMap, HashMap};

use fusec::fusion::{self, partition, Fused, FusionLimits, KernelKind, Mode, Partition};
use fusec::import::{import, ImportOptions, Model};
use fusec::ir::{self, rel_l2};
use fusec::passes::{run_passes, standard};

fn fused(file: &str, options: &ImportOptions) -> (Model, Fused) {
    let model = import(&common::model_path(file), options).unwrap_or_else(|e| panic!("{e}"));
    let mut graph = model.graph.clone();
    run_passes(&mut graph, &standard()).unwrap();
    let fused = fusion::fuse(&graph, &FusionLimits::default()).unwrap_or_else(|e| panic!("{file}: {e}"));
    (model, fused)
}

fn fused_partition(fused: &Fused) -> Partition {
    partition(&fused.graph, &fused.covers, Mode::Fused).unwrap()
}

#[test]
fn fused_graphs_keep_every_fixture_meaning() {
    for file in common::all_fixtures() {
        for (variant, options) in common::shape_variants(&file).into_iter().enumerate() {
            let (model, fused) = fused(&file, &options);
            assert_eq!(fused.report.stop_reason, "Saturated", "{file}: {:?}", fused.report);
            let feeds: HashMap<_, _> =
                common::random_inputs(&model, 40 + variant as u64).into_iter().collect();
            let before = ir::evaluate(&model.graph, &feeds).unwrap();
            let after = ir::evaluate(&fused.graph, &feeds).unwrap_or_else(|e| panic!("{file}: {e}"));
            for ((name, a), (_, b)) in after.iter().zip(&before) {
                let err = rel_l2(a, b);
                assert!(err <= 1e-5, "{file} {options:?} {name}: fused rel-L2 {err:e}");
            }
        }
    }
}

fn counts(fused: &Fused) -> BTreeMap<String, usize> {
    fused.histogram()
}

fn count(h: &BTreeMap<String, usize>, op: &str) -> usize {
    h.get(op).copied().unwrap_or(0)
}

/// Ops that must not survive fusion in a recognised model: every one of them belongs to a
/// LayerNorm, GELU, softmax, attention or dropout that was recognised.
const DECOMPOSED: &[&str] = &[
    "Dropout",
    "Identity",
    "Erf",
    "Tanh",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "ReduceMean",
    "IsNaN",
    "Where",
    "Softmax",
    "Div",
];

fn assert_recognised(file: &str, layers: usize, gelu: &str) {
    let options = common::shape_variants(file).remove(1);
    let (_, fused) = fused(file, &options);
    let h = counts(&fused);
    // Two LayerNorms per layer plus the embeddings' (BERT) or the final one (GPT-2).
    assert_eq!(count(&h, "LayerNorm"), 2 * layers + 1, "{file}: {h:?}");
    assert_eq!(count(&h, gelu), layers, "{file}: {h:?}");
    assert_eq!(count(&h, "Attention"), layers, "{file}: {h:?}");
    for op in DECOMPOSED {
        assert_eq!(count(&h, op), 0, "{file}: {op} left after fusion: {h:?}");
    }
}

#[test]
fn bert_blocks_are_recognised() {
    assert_recognised("bert_ts.onnx", 2, "Gelu");
    assert_recognised("bert_dynamo.onnx", 2, "Gelu");
    assert_recognised("bert12_ts.onnx", 12, "Gelu");
}

#[test]
fn gpt2_blocks_are_recognised() {
    assert_recognised("gpt2_ts.onnx", 2, "GeluTanh");
    assert_recognised("gpt2_dynamo.onnx", 2, "GeluTanh");
}

#[test]
fn llama_and_vit_blocks_are_recognised() {
    for file in ["llama_ts.onnx", "llama_dynamo.onnx"] {
        let (_, fused) = fused(file, &common::shape_variants(file)[0]);
        let h = counts(&fused);
        assert_eq!((count(&h, "RmsNorm"), count(&h, "Attention")), (5, 2), "{file}: {h:?}");
        for op in ["Pow", "Sqrt", "Reciprocal", "ReduceMean", "Softmax", "IsNaN", "Where", "Neg", "Concat"] {
            assert_eq!(count(&h, op), 0, "{file}: {op} left: {h:?}");
        }
        // The rotate-half of Q and K in each of the two layers.
        assert_eq!(count(&h, "RotateHalf"), 4, "{file}: {h:?}");
    }
    for file in ["vit_ts.onnx", "vit_dynamo.onnx"] {
        let (_, fused) = fused(file, &common::shape_variants(file)[0]);
        let h = counts(&fused);
        assert_eq!(
            (count(&h, "LayerNorm"), count(&h, "Gelu"), count(&h, "Attention")),
            (5, 2, 2),
            "{file}: {h:?}"
        );
    }
}

#[test]
fn handbuilt_variants_are_recognised() {
    for (file, op) in [
        ("layernorm_div.onnx", "LayerNorm"),
        ("layernorm_reciprocal.onnx", "LayerNorm"),
        ("layernorm_ex2.onnx", "LayerNorm"),
        ("rmsnorm.onnx", "RmsNorm"),
        ("gelu_erf_div.onnx", "Gelu"),
        ("gelu_erf_mul.onnx", "Gelu"),
        ("gelu_op.onnx", "Gelu"),
        ("gelu_tanh.onnx", "GeluTanh"),
        ("softmax_decomposed.onnx", "Softmax"),
    ] {
        let (_, fused) = fused(file, &common::shape_variants(file)[0]);
        let h = counts(&fused);
        assert_eq!(h, BTreeMap::from([(op.to_string(), 1)]), "{file}: the whole graph should be one {op}");
    }
    let (_, fused) = fused("mlp_block.onnx", &common::shape_variants("mlp_block.onnx")[0]);
    let h = counts(&fused);
    assert_eq!((count(&h, "Dropout"), count(&h, "Gelu"), count(&h, "LayerNorm")), (0, 1, 1), "{h:?}");
    let kinds: Vec<String> = fused_partition(&fused).kernels.iter().map(|k| k.kind.name()).collect();
    assert_eq!(kinds, ["gemm+bias+gelu", "gemm+bias", "row:LayerNorm"]);
}

/// The kernels of each encoder layer, from the ONNX node names they cover
/// (`/encoder/layer.N/...` in the TorchScript export): the layer most of them name (a node
/// merged from several layers, such as a shared mask, names the others too).
fn kernels_per_layer(part: &Partition) -> BTreeMap<usize, Vec<String>> {
    let mut layers: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for kernel in &part.kernels {
        let mut votes: BTreeMap<usize, usize> = BTreeMap::new();
        for name in &kernel.covers {
            let layer = name.split("/layer.").nth(1).and_then(|r| r.split('/').next()?.parse::<usize>().ok());
            if let Some(layer) = layer {
                *votes.entry(layer).or_default() += 1;
            }
        }
        let layer = votes.iter().max_by_key(|(_, &n)| n).map(|(&l, _)| l);
        if let Some(layer) = layer {
            layers.entry(layer).or_default().push(kernel.kind.name());
        }
    }
    layers
}

#[test]
fn bert_layers_take_at_most_seven_launches() {
    for (file, layers) in [("bert_ts.onnx", 2), ("bert12_ts.onnx", 12), ("bert_dynamo.onnx", 2)] {
        let (_, fused) = fused(file, &common::shape_variants(file)[2]);
        let part = fused_partition(&fused);
        assert_eq!(part.graph_breaks, 0);
        // The embeddings take a gather and a LayerNorm (with the position adds as prologue).
        assert!(part.launches() <= 7 * layers + 2, "{file}: {} launches", part.launches());
        assert_eq!(part.gemm_calls(), 4 * layers, "{file}: QKV, output, FC1, FC2 per layer");
        assert_eq!(part.count(|k| *k == KernelKind::Attention), layers, "{file}");
        if file.ends_with("_ts.onnx") {
            let per_layer = kernels_per_layer(&part);
            assert_eq!(per_layer.len(), layers, "{file}: {per_layer:?}");
            for (layer, kinds) in per_layer {
                assert_eq!(
                    kinds,
                    [
                        "gemm+bias",
                        "attention",
                        "gemm+bias",
                        "row:LayerNorm",
                        "gemm+bias+gelu",
                        "gemm+bias",
                        "row:LayerNorm"
                    ],
                    "{file} layer {layer}"
                );
            }
        }
    }
}

#[test]
fn llama_layers_take_at_most_ten_launches() {
    for file in ["llama_ts.onnx", "llama_dynamo.onnx"] {
        for options in common::shape_variants(file) {
            let (_, fused) = fused(file, &options);
            let part = fused_partition(&fused);
            let kinds: Vec<String> = part.kernels.iter().map(|k| k.kind.name()).collect();
            // Per layer: QKV, output, gate+up and down GEMMs; attention; two RMSNorms (the
            // second with the residual add as prologue); the rotation of Q and of K; SiLU·up.
            // Around them: the embedding gather and the first layer's input RMSNorm.
            assert_eq!(part.launches(), 2 + 10 * 2, "{file} {options:?}: {kinds:?}");
            assert_eq!(part.gemm_calls(), 4 * 2, "{file}: {kinds:?}");
            assert_eq!(part.count(|k| *k == KernelKind::Pointwise), 3 * 2, "{file}: {kinds:?}");
            // Each rotation is one kernel that reads Q (or K) where the QKV GEMM wrote it.
            let rotations: Vec<_> = part
                .kernels
                .iter()
                .filter(|k| k.nodes.iter().any(|&n| matches!(fused.graph.node(n).op, ir::Op::RotateHalf)))
                .collect();
            assert_eq!(rotations.len(), 4, "{file}: {kinds:?}");
            for k in rotations {
                assert_eq!(k.kind, KernelKind::Pointwise, "{file}");
                assert_eq!(k.outputs.len(), 1, "{file}: {k:?}");
            }
        }
    }
}

#[test]
fn gpt2_layers_fuse_gelu_and_residuals() {
    let (_, fused) = fused("gpt2_ts.onnx", &common::shape_variants("gpt2_ts.onnx")[0]);
    let part = fused_partition(&fused);
    assert_eq!(part.launches(), 16, "{:?}", part.kernels.iter().map(|k| k.kind.name()).collect::<Vec<_>>());
    assert_eq!(part.count(|k| matches!(k, KernelKind::Gemm { epilogue } if epilogue == &["gelutanh"])), 2);
    // GPT-2 is pre-LN: the residual sum feeds the next LayerNorm and the next residual, so the
    // LayerNorm kernel that computes it also writes it out.
    let multi_output = part.kernels.iter().filter(|k| k.outputs.len() > 1).count();
    assert!(multi_output >= 3, "{multi_output} multi-output kernels");
}

#[test]
fn unfused_baseline_launches_one_kernel_per_node() {
    let file = "bert_ts.onnx";
    let (model, fused) = fused(file, &common::shape_variants(file)[0]);
    let unfused = partition(&model.graph, &HashMap::new(), Mode::OneKernelPerNode).unwrap();
    let reshapes = count(&model.graph.op_histogram(), "Reshape");
    let nodes: usize = model.graph.op_histogram().values().sum();
    assert_eq!(unfused.launches(), nodes - reshapes);
    assert_eq!(unfused.gemm_calls(), count(&model.graph.op_histogram(), "MatMul"));
    assert!(fused_partition(&fused).launches() * 3 < unfused.launches());
}

#[test]
fn every_kernel_says_which_onnx_nodes_it_covers() {
    let (model, fused) = fused("bert_ts.onnx", &common::shape_variants("bert_ts.onnx")[0]);
    let part = fused_partition(&fused);
    for kernel in &part.kernels {
        assert!(!kernel.covers.is_empty(), "{kernel:?}");
        assert!(!kernel.outputs.is_empty(), "{kernel:?}");
    }
    let covered: std::collections::HashSet<&str> =
        part.kernels.iter().flat_map(|k| k.covers.iter().map(String::as_str)).collect();
    // Every ONNX node that survived import into a computing IR node is covered by a kernel.
    for id in model.graph.node_ids() {
        let node = model.graph.node(id);
        if matches!(node.op, ir::Op::Input { .. } | ir::Op::Constant(_)) {
            continue;
        }
        assert!(
            covered.contains(node.origin.node.as_str()),
            "{} ({}) is in no kernel",
            node.origin.node,
            node.op.kind()
        );
    }
}

/// The cost model chooses between the attention kernel and GEMM + softmax + GEMM per shape
/// and precision: half types always take the tensor-core kernel; in f32, a small problem
/// takes the kernel and a large one the GEMMs, whose arithmetic runs several times faster.
#[test]
fn attention_or_gemms_is_chosen_per_shape_and_precision() {
    let attention_kernels = |batch: usize, precision: ir::DType| {
        let options = ImportOptions::default().dim("batch", batch);
        let model = import(&common::model_path("attention_d64.onnx"), &options).unwrap();
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap();
        let limits = FusionLimits { precision, ..Default::default() };
        let fused = fusion::fuse(&graph, &limits).unwrap();
        let part = fused_partition(&fused);
        let gemms = part.gemm_calls();
        let attention = part.kernels.iter().filter(|k| matches!(k.kind, KernelKind::Attention)).count();
        (attention, gemms)
    };
    // 12 heads, 77 queries and keys, depth 64.
    assert_eq!(attention_kernels(1, ir::DType::F32), (1, 0));
    assert_eq!(attention_kernels(8, ir::DType::F32), (1, 0));
    assert_eq!(attention_kernels(32, ir::DType::F32), (0, 2));
    for precision in [ir::DType::F16, ir::DType::BF16] {
        for batch in [1, 8, 32] {
            assert_eq!(attention_kernels(batch, precision), (1, 0), "{precision} batch {batch}");
        }
    }
}

/// The exporters' NaN guard after a softmax, `where(isnan(s), 0, s)`, becomes one pointwise
/// `nan0` after the softmax where no attention kernel takes it, with the same values: a
/// row of -inf scores comes out as zeros.
#[test]
fn softmax_nan_guard_becomes_one_pointwise_op() {
    use fusion::partition as part_of;
    use ir::{Graph, Op, Origin, Tensor, TensorType, UnaryOp};
    use std::sync::Arc;
    let origin = |n: &str| Origin::new(n, "test");
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(ir::DType::F32, vec![3, 5]));
    let s = g.add_op(Op::Softmax { axis: 1 }, &[x], "s", origin("s")).unwrap();
    let nan = g.add_op(Op::Unary(UnaryOp::IsNaN), &[s], "nan", origin("nan")).unwrap();
    let zero = g.add_constant("zero", Arc::new(Tensor::scalar_f32(0.0)), origin("zero"));
    let y = g.add_op(Op::Where, &[nan, zero, s], "y", origin("y")).unwrap();
    g.set_outputs(vec![("y".into(), y)]);
    let fused = fusion::fuse(&g, &FusionLimits::default()).unwrap();
    let h = counts(&fused);
    assert_eq!((count(&h, "NanToZero"), count(&h, "Where"), count(&h, "IsNaN")), (1, 0, 0), "{h:?}");
    assert_eq!(part_of(&fused.graph, &fused.covers, Mode::Fused).unwrap().launches(), 1);
    let mut values = vec![0.5f32; 15];
    values[5..10].fill(f32::NEG_INFINITY);
    values[0] = -1.0;
    let input = Tensor::F32(ndarray::ArrayD::from_shape_vec(vec![3, 5], values).unwrap());
    let feeds: HashMap<String, Tensor> = [("x".to_string(), input)].into_iter().collect();
    let before = ir::evaluate(&g, &feeds).unwrap();
    let after = ir::evaluate(&fused.graph, &feeds).unwrap();
    assert_eq!(before, after);
    assert!(after[0].1.to_f64_vec()[5..10].iter().all(|&v| v == 0.0));
}

/// The exporters' padding masks (`where(mask[b, None, None, :] & causal, 0, min)`, built once
/// and read by every layer) are computed inside each layer's attention kernel from the `[b, k]`
/// input: no kernel writes the `[b, 1, q, k]` mask, each attention kernel covers the mask's
/// ONNX nodes, and the program computes what the model does.
#[test]
fn padding_masks_are_computed_inside_attention() {
    for file in ["bert_mask_ts.onnx", "bert_mask_dynamo.onnx", "gpt2_mask_ts.onnx", "gpt2_mask_dynamo.onnx"] {
        let (model, fused) = fused(file, &common::dims_at(file, "3", "11"));
        let (mut graph, mut covers) = (fused.graph.clone(), fused.covers.clone());
        assert_eq!(fusec::passes::own_attention_masks(&mut graph, &mut covers).unwrap(), 1, "{file}");
        let part = partition(&graph, &covers, Mode::Fused).unwrap();
        let attention: Vec<_> = part.kernels.iter().filter(|k| k.kind == KernelKind::Attention).collect();
        assert_eq!(attention.len(), 2, "{file}");
        for kernel in &part.kernels {
            assert!(
                !matches!(kernel.kind, KernelKind::Pointwise | KernelKind::Gather)
                    || kernel.outputs.iter().all(|&o| graph.node(o).ty.shape.len() == 3),
                "{file}: a kernel besides attention computes the mask: {kernel:?}"
            );
        }
        // The mask's cast of the i64 input is in both layers' kernels.
        let cast = graph
            .node_ids()
            .find(|&n| matches!(graph.node(n).op, ir::Op::Cast { to: ir::DType::Bool }))
            .map(|n| graph.node(n).origin.node.clone())
            .unwrap_or_else(|| panic!("{file}: no cast to bool"));
        for kernel in &attention {
            assert!(kernel.covers.contains(&cast), "{file}: {:?} lacks {cast}", kernel.covers);
            assert!(kernel.nodes.len() > 1 && kernel.outputs.len() == 1, "{file}: {kernel:?}");
        }
        // Two layers, one copy: each reads a prologue of its own, the same arithmetic.
        let feeds: HashMap<_, _> = common::random_inputs(&model, 7).into_iter().collect();
        let expected = ir::evaluate(&model.graph, &feeds).unwrap();
        let got = ir::evaluate(&graph, &feeds).unwrap();
        let err = rel_l2(&got[0].1, &expected[0].1);
        assert!(err <= 1e-5, "{file}: rel-L2 {err:e}");
    }
}
