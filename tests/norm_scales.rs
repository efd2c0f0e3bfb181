//! `passes::FoldNormScales`: a norm's scale and shift folded into the products after it keep
//! the graph's meaning, and the norms it folds lose their scale.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::onnx::normed_block;
use fusec::codegen::{KernelSource, Step};
use fusec::fusion::{fuse, FusionLimits};
use fusec::import::import;
use fusec::ir::{self, random_tensor, rel_l2, BinaryOp, DType, Graph, Op, Origin, Tensor, TensorType};
use fusec::passes::{run_passes, standard, FoldNormScales, Pass};
use fusec::pipeline::CompileOptions;

fn origin(name: &str) -> Origin {
    Origin::new(name, "Test")
}

fn constant(g: &mut Graph, name: &str, shape: &[usize], seed: u64, low: f64, high: f64) -> fusec::ir::NodeId {
    let ty = TensorType::new(DType::F32, shape.to_vec());
    g.add_constant(name, Arc::new(random_tensor(&ty, seed, low, high)), origin(name))
}

/// x `[5, 3, 40]` → LayerNorm (scale, shift) → MatMul `[40, 24]` + bias; the same x →
/// RMSNorm (scale) → Gemm with weights `[24, 40]` read transposed, α 0.5, a bias by β 2.
fn two_norms() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![5, 3, 40]));
    let gamma = constant(&mut g, "gamma", &[40], 1, 0.5, 1.5);
    let beta = constant(&mut g, "beta", &[40], 2, -0.5, 0.5);
    let ln =
        g.add_op(Op::LayerNorm { axis: 2, epsilon: 1e-5 }, &[x, gamma, beta], "ln", origin("ln")).unwrap();
    let w = constant(&mut g, "w", &[40, 24], 3, -0.3, 0.3);
    let mm = g.add_op(Op::MatMul, &[ln, w], "mm", origin("mm")).unwrap();
    let b = constant(&mut g, "b", &[24], 4, -1.0, 1.0);
    let y = g.add_op(Op::Binary(BinaryOp::Add), &[mm, b], "y", origin("add")).unwrap();
    let scale = constant(&mut g, "scale", &[40], 5, 0.5, 1.5);
    let rms = g
        .add_op(Op::RmsNorm { axis: 2, epsilon: 1e-6, deviation: false }, &[x, scale], "rms", origin("rms"))
        .unwrap();
    let flat = g.add_op(Op::Reshape { shape: vec![15, 40] }, &[rms], "flat", origin("flat")).unwrap();
    let wt = constant(&mut g, "wt", &[24, 40], 6, -0.3, 0.3);
    let c = constant(&mut g, "c", &[24], 7, -1.0, 1.0);
    let gemm = Op::Gemm { alpha: 0.5, beta: 2.0, trans_a: false, trans_b: true };
    let z = g.add_op(gemm, &[flat, wt, c], "z", origin("gemm")).unwrap();
    g.set_outputs(vec![("y".into(), y), ("z".into(), z)]);
    g
}

fn evaluate(g: &Graph, feeds: &HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    ir::evaluate(g, feeds).unwrap()
}

#[test]
fn folded_scales_and_shifts_keep_the_products() {
    let g = two_norms();
    let x = random_tensor(&TensorType::new(DType::F32, vec![5, 3, 40]), 9, -2.0, 3.0);
    let feeds: HashMap<String, Tensor> = [("x".to_string(), x)].into_iter().collect();
    let before = evaluate(&g, &feeds);
    let mut folded = g.clone();
    assert_eq!(FoldNormScales::default().run(&mut folded).unwrap(), 2);
    ir::verify(&folded).unwrap();
    let after = evaluate(&folded, &feeds);
    for ((name, a), (_, b)) in after.iter().zip(&before) {
        let err = rel_l2(a, b);
        assert!(err <= 1e-5, "{name}: rel-L2 {err:e} after folding");
    }
    // Both norms are now RMSNorms without a scale; the LayerNorm's of the deviations.
    let norms: Vec<(Op, usize)> = folded
        .node_ids()
        .filter(|&id| matches!(folded.node(id).op, Op::RmsNorm { .. } | Op::LayerNorm { .. }))
        .map(|id| (folded.node(id).op.clone(), folded.inputs_of(id).len()))
        .collect();
    assert_eq!(norms.len(), 2);
    assert!(norms.iter().all(|(_, inputs)| *inputs == 1), "{norms:?}");
    assert!(norms.iter().any(|(op, _)| matches!(op, Op::RmsNorm { deviation: true, .. })));
    assert!(norms.iter().any(|(op, _)| matches!(op, Op::RmsNorm { deviation: false, .. })));
}

#[test]
fn norms_read_by_anything_but_a_product_keep_their_scale() {
    // The LayerNorm's value also read by an Add (a post-norm residual): nothing is folded.
    let mut g = two_norms();
    let ln = g.node_ids().find(|&id| matches!(g.node(id).op, Op::LayerNorm { .. })).unwrap();
    let y = g.outputs()[0].1;
    let sum = g.add_op(Op::Binary(BinaryOp::Add), &[ln, ln], "twice", origin("twice")).unwrap();
    let mut outputs = g.outputs().to_vec();
    outputs.push(("twice".into(), sum));
    g.set_outputs(outputs);
    let mut folded = g.clone();
    assert_eq!(FoldNormScales::default().run(&mut folded).unwrap(), 1, "only the RMSNorm");
    assert!(matches!(folded.node(ln).op, Op::LayerNorm { .. }));
    assert_eq!(folded.inputs_of(ln).len(), 3);
    assert!(folded.contains(y));
}

#[test]
fn every_fixture_keeps_its_meaning_with_its_norms_folded() {
    let mut folded_any = 0;
    for file in common::all_fixtures() {
        let options = common::shape_variants(&file).remove(0);
        let model = import(&common::model_path(&file), &options).unwrap();
        let feeds: HashMap<_, _> = common::random_inputs(&model, 5).into_iter().collect();
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap();
        let fused = fuse(&graph, &FusionLimits::default()).unwrap().graph;
        let before = evaluate(&fused, &feeds);
        let mut folded = fused.clone();
        let count = FoldNormScales::default().run(&mut folded).unwrap_or_else(|e| panic!("{file}: {e}"));
        ir::verify(&folded).unwrap_or_else(|e| panic!("{file}: {e}"));
        folded_any += count;
        let after = evaluate(&folded, &feeds);
        for ((name, a), (_, b)) in after.iter().zip(&before) {
            let err = rel_l2(a, b);
            assert!(err <= 1e-5, "{file} {name}: rel-L2 {err:e} with {count} norms folded");
        }
    }
    assert!(folded_any > 0, "no fixture had a norm folded");
}

/// The tensor-core kernels that take a norm in, in `steps`: each kernel of a GEMM step that
/// absorbs the kernel before it, but a gated MLP's gate.
fn norms_taken_in(steps: &[Step]) -> Vec<&KernelSource> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Gemm { absorbs: Some(_), skinny: Some(k), .. } if !k.source.contains("A = x·σ(x)·y") => {
                Some(k)
            }
            _ => None,
        })
        .collect()
}

/// A transformer block's second half (`h = x + x·w0`, its LayerNorm, a product with a bias,
/// one back with the residual) at GPT-2 small's sizes at 32 rows and awkward ones: the
/// LayerNorm's scale and shift folded into the first product's weights and bias, the residual
/// added by the product before it, and the norm taken into the tensor-core kernel folded with
/// no scale read and no rows of A of its own. Every such kernel through NVRTC (no spills); on a
/// GPU, forced and chosen by timing, against tract, in f16 and bf16.
#[test]
fn a_folded_layernorm_is_taken_into_the_tensor_core_kernel_without_its_scale() {
    let dir = tempfile::tempdir().unwrap();
    for (rows, width, inner) in [(32, 768, 2304), (29, 352, 328), (7, 96, 200)] {
        let path = normed_block(dir.path(), rows, width, inner);
        let options = CompileOptions { precision: DType::F16, ..Default::default() };
        let steps = common::compiled_steps(&path, &options);
        let taken = norms_taken_in(&steps);
        assert_eq!(taken.len(), 1, "{rows} × {width} × {inner}: the norm taken in once");
        let k = taken[0];
        assert!(k.source.contains("on tensor cores"), "{}", k.source);
        for absent in ["gamma", "Σ γ·B", "a_term", "statistics(a_in"] {
            assert!(!k.source.contains(absent), "{rows} × {width} × {inner}: `{absent}` in {}", k.source);
        }
        if fusec::nvrtc::available() {
            common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
        }
        common::forced_and_timed_match_tract(
            &path,
            rows as u64 + 200,
            &[(DType::F16, 1e-2), (DType::BF16, 3e-2)],
        );
    }
}

/// A decoding step of the cache fixtures with the layers' norms folded into their products'
/// weights (GPT-2's LayerNorms and the Llama-style decoder's RMSNorms, two a layer), taken into
/// the tensor-core kernels with no scale read, at 7, 13 and 32 rows. Every such kernel through
/// NVRTC (no spills); on a GPU, the kernels forced, against tract.
#[test]
fn a_decoding_steps_folded_norms_are_taken_in_without_their_scales() {
    for (file, batch) in [
        ("gpt2_cache_ts.onnx", 13),
        ("gpt2_cache_ts.onnx", 32),
        ("llama_cache_ts.onnx", 7),
        ("llama_cache_ts.onnx", 32),
    ] {
        let (path, options) = common::decoding_step(file, batch);
        let steps = common::compiled_steps(&path, &options);
        let dir = tempfile::tempdir().unwrap();
        let scaleless: Vec<&KernelSource> =
            norms_taken_in(&steps).into_iter().filter(|k| !k.source.contains("gamma")).collect();
        assert!(
            scaleless.len() >= 4,
            "{file} at {batch}: {} norms taken in without a scale",
            scaleless.len()
        );
        for k in &scaleless {
            assert!(!k.source.contains("Σ γ·B"), "{}", k.source);
            if fusec::nvrtc::available() {
                common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
            }
        }
        common::forced_skinny_matches_tract(&path, &options, 5, 1e-2);
    }
}
