//! Passes keep the model's meaning, and do what their names say.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use fusec::import::import;
use fusec::ir::{self, rel_l2, BinaryOp, DType, Graph, Op, Origin, Tensor, TensorType, UnaryOp};
use fusec::passes::{
    run_passes, standard, ConstFold, Cse, Dce, GatherNdViews, OuterProducts, Pass, RemoveNoops,
    RepeatsAsTiles,
};

#[test]
fn standard_passes_keep_every_fixture_meaning() {
    for file in common::all_fixtures() {
        let options = common::shape_variants(&file).remove(0);
        let model = import(&common::model_path(&file), &options).unwrap();
        let feeds: HashMap<_, _> = common::random_inputs(&model, 5).into_iter().collect();
        let before = ir::evaluate(&model.graph, &feeds).unwrap();
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap_or_else(|e| panic!("{file}: {e}"));
        let after = ir::evaluate(&graph, &feeds).unwrap();
        for ((name, a), (_, b)) in after.iter().zip(&before) {
            let err = rel_l2(a, b);
            assert!(err <= 1e-6, "{file} {name}: rel-L2 {err:e} after passes");
        }
        // Slices may be added: `SliceEarly` slices each input of an op it moves a slice before.
        let others =
            |g: &Graph| g.node_ids().filter(|&id| !matches!(g.node(id).op, Op::Slice { .. })).count();
        assert!(others(&graph) <= others(&model.graph), "{file}: passes added nodes");
    }
}

#[test]
fn llama_identity_casts_are_removed() {
    let path = common::model_path("llama_ts.onnx");
    let model = import(&path, &common::shape_variants("llama_ts.onnx")[0]).unwrap();
    let before = model.graph.op_histogram().get("Cast").copied().unwrap_or(0);
    assert!(before > 0, "the fixture has run-time casts to start with");
    let mut graph = model.graph.clone();
    let report = run_passes(&mut graph, &standard()).unwrap();
    assert_eq!(graph.op_histogram().get("Cast"), None, "{report:?}");
}

fn origin(name: &str) -> Origin {
    Origin::new(name, "Test")
}

#[test]
fn cse_merges_twins_and_dce_drops_the_dead() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![4]));
    let a = g.add_op(Op::Unary(UnaryOp::Exp), &[x], "a", origin("exp_a")).unwrap();
    let b = g.add_op(Op::Unary(UnaryOp::Exp), &[x], "b", origin("exp_b")).unwrap();
    let sum = g.add_op(Op::Binary(BinaryOp::Add), &[a, b], "sum", origin("add")).unwrap();
    g.add_op(Op::Unary(UnaryOp::Tanh), &[x], "dead", origin("dead")).unwrap();
    g.set_outputs(vec![("sum".into(), sum)]);
    assert_eq!(Cse.run(&mut g).unwrap(), 1);
    let inputs = g.inputs_of(sum);
    assert!(inputs[0] == inputs[1] && (inputs[0] == a || inputs[0] == b), "{inputs:?}");
    assert_eq!(Dce.run(&mut g).unwrap(), 1);
    assert_eq!(g.op_histogram().into_iter().collect::<Vec<_>>(), vec![("Add".into(), 1), ("Exp".into(), 1)]);
    ir::verify(&g).unwrap();
}

#[test]
fn const_fold_and_noop_removal() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3]));
    let c = g.add_constant("c", Arc::new(Tensor::scalar_f32(4.0)), origin("c"));
    let root = g.add_op(Op::Unary(UnaryOp::Sqrt), &[c], "root", origin("sqrt")).unwrap();
    let cast = g.add_op(Op::Cast { to: DType::F32 }, &[x], "cast", origin("cast")).unwrap();
    let same = g.add_op(Op::Reshape { shape: vec![2, 3] }, &[cast], "same", origin("reshape")).unwrap();
    let y = g.add_op(Op::Binary(BinaryOp::Mul), &[same, root], "y", origin("mul")).unwrap();
    g.set_outputs(vec![("y".into(), y)]);
    assert_eq!(ConstFold.run(&mut g).unwrap(), 1);
    assert_eq!(g.constant(g.inputs_of(y)[1]).unwrap().to_f64_vec(), vec![2.0]);
    assert_eq!(RemoveNoops.run(&mut g).unwrap(), 2);
    assert_eq!(g.inputs_of(y)[0], x);
    ir::verify(&g).unwrap();
}

/// The f16 and the mixed bf16 graphs keep every fixture within 1e-2 of f32, evaluated on the
/// CPU with rounding after every IR op in a half type; bf16 keeps the residual stream in f32,
/// so a GEMM's operands are bf16 and its consumer outside the GEMM reads them back in f32.
#[test]
fn half_precision_keeps_every_fixture_close() {
    for file in common::all_fixtures() {
        let options = common::shape_variants(&file).remove(0);
        let model = import(&common::model_path(&file), &options).unwrap();
        let feeds: HashMap<_, _> = common::random_inputs(&model, 9).into_iter().collect();
        let reference = ir::evaluate(&model.graph, &feeds).unwrap();
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap();
        let fused = fusec::fusion::fuse(&graph, &Default::default()).unwrap().graph;
        for precision in [DType::F16, DType::BF16] {
            let (lowered, _) = fusec::passes::lower_precision(fused.clone(), precision).unwrap();
            let types =
                |g: &fusec::ir::Graph| g.inputs().iter().map(|&i| g.node(i).ty.clone()).collect::<Vec<_>>();
            assert_eq!(types(&lowered), types(&model.graph), "{file}: inputs keep their types");
            let out = ir::evaluate(&lowered, &feeds).unwrap();
            for ((name, a), (_, b)) in out.iter().zip(&reference) {
                assert_eq!(a.dtype(), b.dtype(), "{file} {name}: outputs stay in their type");
                let err = rel_l2(a, b);
                let bound = 1e-2;
                assert!(err <= bound, "{file} {precision} {name}: rel-L2 {err:e}");
            }
        }
    }
}

/// GatherND indices that only re-address the data (the dynamo exporter's padding mask:
/// `mask[arange(b)[:, None, None, None], arange(k)]`, here also broadcast over 3 queries)
/// become a Reshape and an Expand that compute the same; indices that reorder do not.
#[test]
fn gathernd_of_a_coordinate_grid_becomes_a_view() {
    let (b, q, k) = (2usize, 3usize, 5usize);
    let grid = |reverse: bool| {
        let mut values = Vec::new();
        for i in 0..b {
            for _ in 0..q {
                for t in 0..k {
                    values.extend([i as i64, if reverse { (k - 1 - t) as i64 } else { t as i64 }]);
                }
            }
        }
        let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[b, 1, q, k, 2]), values).unwrap();
        Arc::new(Tensor::from_i64(array, DType::I64))
    };
    for reverse in [false, true] {
        let mut g = Graph::new();
        let x = g.add_input("mask", TensorType::new(DType::F32, vec![b, k]));
        let idx = g.add_constant("idx", grid(reverse), origin("idx"));
        let y = g.add_op(Op::GatherNd { batch_dims: 0 }, &[x, idx], "y", origin("gathernd")).unwrap();
        g.set_outputs(vec![("y".into(), y)]);
        let feeds: HashMap<_, _> =
            [("mask".to_string(), ir::random_tensor(&TensorType::new(DType::F32, vec![b, k]), 3, -1.0, 1.0))]
                .into();
        let before = ir::evaluate(&g, &feeds).unwrap();
        let changed = GatherNdViews.run(&mut g).unwrap();
        ir::verify(&g).unwrap();
        let after = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(after[0].1.to_f64_vec(), before[0].1.to_f64_vec(), "reverse {reverse}");
        let ops = g.op_histogram();
        if reverse {
            assert_eq!((changed, ops.get("GatherND")), (0, Some(&1)), "{ops:?}");
        } else {
            assert_eq!(changed, 1);
            assert_eq!(
                (ops.get("Reshape"), ops.get("Expand"), ops.get("GatherND")),
                (Some(&1), Some(&1), None)
            );
        }
    }
}

/// A Gather of every position of an axis in order (the TorchScript exporter's padding mask:
/// the flattened mask gathered at `b·seq + s`) becomes a Reshape; indices out of order, or
/// not all of the axis, stay a Gather.
#[test]
fn gather_of_every_position_in_order_becomes_a_reshape() {
    let (b, k) = (3usize, 5usize);
    let cases: [(Vec<i64>, bool); 4] = [
        ((0..(b * k) as i64).collect(), true),
        // Negative positions count from the end: the same positions.
        ((0..(b * k) as i64).map(|p| p - (b * k) as i64).collect(), true),
        ((0..(b * k) as i64).rev().collect(), false),
        ((0..(b * k - 1) as i64).chain([0]).collect(), false),
    ];
    for (values, view) in cases {
        let mut g = Graph::new();
        let x = g.add_input("mask", TensorType::new(DType::F32, vec![b * k, 1]));
        let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[b, 1, 1, k]), values.clone()).unwrap();
        let idx = g.add_constant("idx", Arc::new(Tensor::from_i64(array, DType::I64)), origin("idx"));
        let y = g.add_op(Op::Gather { axis: 0 }, &[x, idx], "y", origin("gather")).unwrap();
        g.set_outputs(vec![("y".into(), y)]);
        let feeds: HashMap<_, _> = [(
            "mask".to_string(),
            ir::random_tensor(&TensorType::new(DType::F32, vec![b * k, 1]), 5, -1.0, 1.0),
        )]
        .into();
        let before = ir::evaluate(&g, &feeds).unwrap();
        let changed = GatherNdViews.run(&mut g).unwrap();
        ir::verify(&g).unwrap();
        let after = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(after[0].1.to_f64_vec(), before[0].1.to_f64_vec(), "{values:?}");
        let ops = g.op_histogram();
        let expected = if view { (1, Some(&1), None) } else { (0, None, Some(&1)) };
        assert_eq!((changed, ops.get("Reshape"), ops.get("Gather")), expected, "{values:?}: {ops:?}");
    }
}

#[test]
fn gather_of_one_position_becomes_a_slice() {
    // PyTorch's multi-head attention: the packed projection [3, s, b, e], then proj[0], proj[1],
    // proj[2]; also a [1]-shaped index (the axis kept) and positions counted from the end.
    let shape = vec![3usize, 5, 2, 7];
    let cases: [(Vec<usize>, i64, usize, bool); 6] = [
        (vec![], 0, 0, true),
        (vec![], 2, 0, true),
        (vec![], -1, 0, true),
        (vec![1], 3, 1, true),
        (vec![], -3, 3, true),
        // Out of range: left for the gather to report at run time.
        (vec![], 7, 3, false),
    ];
    for (index_shape, position, axis, view) in cases {
        let mut g = Graph::new();
        let x = g.add_input("x", TensorType::new(DType::F32, shape.clone()));
        let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&index_shape), vec![position]).unwrap();
        let idx = g.add_constant("idx", Arc::new(Tensor::from_i64(array, DType::I64)), origin("idx"));
        let Ok(y) = g.add_op(Op::Gather { axis }, &[x, idx], "y", origin("gather")) else {
            assert!(!view, "position {position} of axis {axis}");
            continue;
        };
        g.set_outputs(vec![("y".into(), y)]);
        let feeds: HashMap<_, _> =
            [("x".to_string(), ir::random_tensor(&TensorType::new(DType::F32, shape.clone()), 9, -1.0, 1.0))]
                .into();
        let before = ir::evaluate(&g, &feeds);
        let changed = GatherNdViews.run(&mut g).unwrap();
        ir::verify(&g).unwrap();
        let ops = g.op_histogram();
        if !view {
            assert_eq!((changed, ops.get("Gather")), (0, Some(&1)), "{position}: {ops:?}");
            continue;
        }
        let after = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(after[0].1.to_f64_vec(), before.unwrap()[0].1.to_f64_vec(), "{position} of axis {axis}");
        assert_eq!(
            (changed, ops.get("Slice"), ops.get("Gather")),
            (1, Some(&1), None),
            "{position}: {ops:?}"
        );
    }
}

#[test]
fn an_add_of_zeros_is_removed_through_a_broadcast_view() {
    let zero = |g: &mut Graph, shape: Vec<usize>, value: f64| {
        let t = Tensor::full(&TensorType::new(DType::F32, shape), value);
        g.add_constant("zeros", Arc::new(t), origin("zeros"))
    };
    // (the constant's shape, expanded to the bias's, its value, whether the add goes)
    let cases = [(vec![1], true, 0.0, true), (vec![6], false, 0.0, true), (vec![1], true, 0.5, false)];
    for (shape, expanded, value, removed) in cases {
        let mut g = Graph::new();
        let x = g.add_input("x", TensorType::new(DType::F32, vec![4, 6]));
        let mut b = zero(&mut g, shape.clone(), value);
        if expanded {
            b = g.add_op(Op::Expand { shape: vec![6] }, &[b], "bias", origin("expand")).unwrap();
        }
        let y = g.add_op(Op::Binary(BinaryOp::Add), &[b, x], "y", origin("add")).unwrap();
        let z = g.add_op(Op::Unary(UnaryOp::Tanh), &[y], "z", origin("tanh")).unwrap();
        g.set_outputs(vec![("z".into(), z)]);
        let feeds: HashMap<_, _> =
            [("x".to_string(), ir::random_tensor(&TensorType::new(DType::F32, vec![4, 6]), 3, -1.0, 1.0))]
                .into();
        let before = ir::evaluate(&g, &feeds).unwrap();
        RemoveNoops.run(&mut g).unwrap();
        ir::verify(&g).unwrap();
        let after = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(after[0].1.to_f64_vec(), before[0].1.to_f64_vec(), "{shape:?} {value}");
        assert_eq!(!g.op_histogram().contains_key("Add"), removed, "{shape:?} {value}");
    }
    // A sum broadcast wider than its other operand is not that operand.
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![6]));
    let b = zero(&mut g, vec![4, 6], 0.0);
    let y = g.add_op(Op::Binary(BinaryOp::Add), &[x, b], "y", origin("add")).unwrap();
    g.set_outputs(vec![("y".into(), y)]);
    assert_eq!(RemoveNoops.run(&mut g).unwrap(), 0);
}

#[test]
fn constants_several_graphs_hold_are_halved_once() {
    let weight = Arc::new(ir::random_tensor(&TensorType::new(DType::F32, vec![8, 4]), 2, -1.0, 1.0));
    let graph = |rows: usize| {
        let mut g = Graph::new();
        let x = g.add_input("x", TensorType::new(DType::F32, vec![rows, 8]));
        let w = g.add_constant("w", weight.clone(), origin("w"));
        let y = g.add_op(Op::MatMul, &[x, w], "y", origin("matmul")).unwrap();
        g.set_outputs(vec![("y".into(), y)]);
        (g, w)
    };
    let ((mut a, wa), (mut b, wb)) = (graph(2), graph(5));
    let halved = fusec::passes::halve_constants(&mut [&mut a, &mut b], DType::F16, None);
    assert!(Arc::ptr_eq(&halved[0][&wa], &halved[1][&wb]), "one conversion for both graphs");
    assert_eq!(*halved[0][&wa], weight.cast(DType::F16));
    // The graphs no longer hold the f32 value: the test's handle is the only one left.
    assert_eq!(Arc::strong_count(&weight), 1);
    for (g, halved) in [(a, &halved[0]), (b, &halved[1])] {
        let (lowered, _) =
            fusec::passes::lower_precision_halved(g, DType::F16, None, Some(halved.clone())).unwrap();
        let w = lowered.node_ids().find(|&id| lowered.node(id).name == "w").unwrap();
        assert!(Arc::ptr_eq(lowered.constant(w).unwrap(), &halved[&wa]));
    }
}

#[test]
fn a_gemms_c_of_zeros_is_dropped() {
    for (value, dropped) in [(0.0, true), (0.25, false)] {
        let mut g = Graph::new();
        let a = g.add_input("a", TensorType::new(DType::F32, vec![5, 3]));
        let w = Arc::new(ir::random_tensor(&TensorType::new(DType::F32, vec![3, 4]), 4, -1.0, 1.0));
        let w = g.add_constant("w", w, origin("w"));
        let c = Tensor::full(&TensorType::new(DType::F32, vec![1]), value);
        let c = g.add_constant("c", Arc::new(c), origin("c"));
        let c = g.add_op(Op::Expand { shape: vec![4] }, &[c], "c_view", origin("expand")).unwrap();
        let gemm = Op::Gemm { alpha: 1.5, beta: 2.0, trans_a: false, trans_b: false };
        let y = g.add_op(gemm, &[a, w, c], "y", origin("gemm")).unwrap();
        g.set_outputs(vec![("y".into(), y)]);
        let feeds: HashMap<_, _> =
            [("a".to_string(), ir::random_tensor(&TensorType::new(DType::F32, vec![5, 3]), 6, -1.0, 1.0))]
                .into();
        let before = ir::evaluate(&g, &feeds).unwrap();
        RemoveNoops.run(&mut g).unwrap();
        ir::verify(&g).unwrap();
        let after = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(after[0].1.to_f64_vec(), before[0].1.to_f64_vec(), "C = {value}");
        let (_, y) = &g.outputs()[0];
        assert_eq!(g.inputs_of(*y).len() == 2, dropped, "C = {value}");
        // The kernel computing the product still names the ONNX node of C's view.
        assert_eq!(g.node(*y).origin.onnx_nodes().any(|n| n == "expand"), dropped);
    }
}

/// A broadcast of a constant to a short vector (a LayerNorm's weights of ones, a zero bias)
/// is stored after fusion rather than copied out by a kernel on every run; a longer or
/// higher-rank broadcast stays a view. The values are the same.
#[test]
fn small_broadcast_vectors_are_stored() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![3, 5, 16]));
    let one = g.add_constant("one", Arc::new(Tensor::scalar_f32(1.0)), origin("one"));
    let zero = g.add_constant("zero", Arc::new(Tensor::scalar_f32(0.25)), origin("zero"));
    let weight = g.add_op(Op::Expand { shape: vec![16] }, &[one], "weight", origin("w")).unwrap();
    let bias = g.add_op(Op::Expand { shape: vec![16] }, &[zero], "bias", origin("b")).unwrap();
    let norm = Op::LayerNorm { axis: 2, epsilon: 1e-5 };
    let y = g.add_op(norm, &[x, weight, bias], "y", origin("norm")).unwrap();
    let wide = g.add_op(Op::Expand { shape: vec![3, 5, 16] }, &[zero], "wide", origin("wide")).unwrap();
    let z = g.add_op(Op::Binary(BinaryOp::Add), &[y, wide], "z", origin("add")).unwrap();
    g.set_outputs(vec![("z".into(), z)]);
    let model_feeds = HashMap::from([(
        "x".to_string(),
        Tensor::from_f64(
            ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[3, 5, 16]), |i| {
                (i[2] * 7 % 5) as f64 - i[1] as f64
            }),
            DType::F32,
        ),
    )]);
    let before = ir::evaluate(&g, &model_feeds).unwrap();
    assert_eq!(fusec::passes::store_small_vectors(&mut g).unwrap(), 2);
    ir::verify(&g).unwrap();
    let expands: Vec<Vec<usize>> = g
        .node_ids()
        .filter(|&n| g.node(n).op.kind() == "Expand")
        .map(|n| g.node(n).ty.shape.clone())
        .collect();
    assert_eq!(expands, [vec![3, 5, 16]], "only the rank-3 broadcast stays a view");
    let after = ir::evaluate(&g, &model_feeds).unwrap();
    assert_eq!(rel_l2(&after[0].1, &before[0].1), 0.0);
}

/// In the mixed bf16 policy a concatenation of an f32 graph input and bf16 values (a decoder's
/// `present = Concat(past, new)`, `new` a projection's product) computes in bf16, as the
/// attention that reads it takes its operands; other mixed concatenations (the input not first,
/// or read by an elementwise op) still widen to f32, and the graph's inputs and outputs keep
/// their types.
#[test]
fn a_cache_concatenation_stays_bf16_in_the_mixed_policy() {
    let mut g = Graph::new();
    let past = g.add_input("past", TensorType::new(DType::F32, vec![1, 2, 3, 4]));
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, 2, 1, 4]));
    let w = ir::random_tensor(&TensorType::new(DType::F32, vec![4, 4]), 3, -1.0, 1.0);
    let w = g.add_constant("w", Arc::new(w), origin("w"));
    let new = g.add_op(Op::MatMul, &[x, w], "new", origin("matmul")).unwrap();
    let present = g.add_op(Op::Concat { axis: 2 }, &[past, new], "present", origin("cat")).unwrap();
    let other = g.add_op(Op::Concat { axis: 2 }, &[new, past], "other", origin("cat2")).unwrap();
    // A concatenation of the same kind that an elementwise op reads.
    let state = g.add_input("state", TensorType::new(DType::F32, vec![1, 2, 3, 4]));
    let kept = g.add_op(Op::Concat { axis: 2 }, &[state, new], "kept", origin("cat3")).unwrap();
    let added = g.add_op(Op::Binary(BinaryOp::Add), &[kept, kept], "added", origin("add")).unwrap();
    g.set_outputs(vec![("present".into(), present), ("other".into(), other), ("added".into(), added)]);
    let (lowered, map) = fusec::passes::lower_precision(g.clone(), DType::BF16).unwrap();
    assert_eq!(lowered.node(map[&present]).op, Op::Concat { axis: 2 });
    assert_eq!(lowered.node(map[&present]).ty.dtype, DType::BF16, "the cache's concatenation");
    assert_eq!(lowered.node(map[&other]).ty.dtype, DType::F32, "another mixed concatenation");
    assert_eq!(lowered.node(map[&kept]).ty.dtype, DType::F32, "a concatenation an addition reads");
    for &(_, out) in lowered.outputs() {
        assert_eq!(lowered.node(out).ty.dtype, DType::F32, "outputs keep their type");
    }
    // The values: the cache's part as given, rounded to bf16.
    let feeds: HashMap<String, Tensor> =
        [("past", &[1usize, 2, 3, 4][..]), ("x", &[1, 2, 1, 4][..]), ("state", &[1, 2, 3, 4][..])]
            .iter()
            .enumerate()
            .map(|(k, (name, shape))| {
                (
                    name.to_string(),
                    ir::random_tensor(&TensorType::new(DType::F32, shape.to_vec()), 10 + k as u64, -1.0, 1.0),
                )
            })
            .collect();
    let (ours, theirs) = (ir::evaluate(&lowered, &feeds).unwrap(), ir::evaluate(&g, &feeds).unwrap());
    for ((name, a), (_, b)) in ours.iter().zip(&theirs) {
        let err = rel_l2(a, b);
        assert!(err > 0.0 && err <= 1e-2, "{name}: rel-L2 {err:e}");
    }
}

/// A MatMul's constant weights of an odd width are stored transposed, read through a
/// `Transpose`; the product is unchanged (exactly: the same sums), weights of a width in
/// packs and weights also read as a left operand are left as they are.
#[test]
fn odd_width_weights_are_stored_by_rows() {
    use fusec::passes::WeightsByRows;
    let values = |n: usize, seed: f32| (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect::<Vec<f32>>();
    let weights = |k: usize, n: usize, seed: f32| {
        Arc::new(Tensor::F32(ndarray::Array::from_shape_vec(vec![k, n], values(k * n, seed)).unwrap()))
    };
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![3, 6]));
    let odd = g.add_constant("odd", weights(6, 7, 0.1), origin("odd"));
    let even = g.add_constant("even", weights(6, 8, 0.2), origin("even"));
    let y = g.add_op(Op::MatMul, &[x, odd], "y", origin("head")).unwrap();
    let z = g.add_op(Op::MatMul, &[x, even], "z", origin("proj")).unwrap();
    g.set_outputs(vec![("y".into(), y), ("z".into(), z)]);
    let x_value = Tensor::F32(ndarray::Array::from_shape_vec(vec![3, 6], values(18, 0.5)).unwrap());
    let feeds: HashMap<_, _> = [("x".to_string(), x_value)].into_iter().collect();
    let before = ir::evaluate(&g, &feeds).unwrap();
    assert_eq!(WeightsByRows::default().run(&mut g).unwrap(), 1);
    ir::verify(&g).unwrap();
    let b = g.inputs_of(y)[1];
    assert_eq!(g.node(b).op, Op::Transpose { perm: vec![1, 0] });
    assert_eq!(g.constant(g.inputs_of(b)[0]).unwrap().shape(), &[7, 6]);
    assert_eq!(g.inputs_of(z)[1], even);
    let after = ir::evaluate(&g, &feeds).unwrap();
    for ((name, a), (_, b)) in after.iter().zip(&before) {
        assert_eq!(rel_l2(a, b), 0.0, "{name}");
    }
}

#[test]
fn a_class_token_read_after_the_last_layer_is_all_that_layer_computes() {
    use fusec::import::ImportOptions;
    // torchvision's VisionTransformer reads `x[:, 0]` after its last encoder layer: that
    // layer's MLP, LayerNorms, output projection and attention queries are then computed for
    // the class token's row alone; the first layer, and the last one's keys and values, for
    // all 17 tokens.
    for file in ["vit_tv_ts.onnx", "vit_tv_dynamo.onnx"] {
        let model = import(&common::model_path(file), &ImportOptions::default().dim("batch", 3)).unwrap();
        let feeds: HashMap<_, _> = common::random_inputs(&model, 11).into_iter().collect();
        let before = ir::evaluate(&model.graph, &feeds).unwrap();
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap_or_else(|e| panic!("{file}: {e}"));
        let after = ir::evaluate(&graph, &feeds).unwrap();
        let err = rel_l2(&after[0].1, &before[0].1);
        assert!(err <= 1e-6, "{file}: rel-L2 {err:e} after passes");
        let shapes = |kind: &str| -> Vec<Vec<usize>> {
            let mut shapes: Vec<Vec<usize>> = graph
                .node_ids()
                .filter(|&id| graph.node(id).op.kind() == kind)
                .map(|id| graph.node(id).ty.shape.clone())
                .collect();
            shapes.sort();
            shapes
        };
        assert_eq!(
            shapes("LayerNorm"),
            [vec![3, 1, 64], vec![3, 1, 64], vec![3, 17, 64], vec![3, 17, 64], vec![3, 17, 64]],
            "{file}"
        );
        // Each layer's scores: the first layer's 17 × 17, the last one's 1 × 17.
        let softmax = shapes("Softmax");
        assert_eq!(softmax.len(), 2, "{file}: {softmax:?}");
        let rows: Vec<usize> = softmax.iter().map(|s| s[s.len() - 2]).collect();
        assert_eq!((rows.iter().min(), rows.iter().max()), (Some(&1), Some(&17)), "{file}: {softmax:?}");
    }
}

#[test]
fn a_slice_moves_before_a_reshape_and_pointwise_ops_but_not_past_a_whole_reader() {
    use fusec::ir::SliceAxis;
    use fusec::passes::SliceEarly;
    let all = |len| SliceAxis { start: 0, step: 1, len };
    // y = Slice(Reshape(Gelu-ish(x · w)), rows 1..2 of axis 0), with x [6, 4] and the reshape
    // [3, 2, 4]: the kept rows are rows 2..4 of x, so the product is of two rows.
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![6, 4]));
    let w = g.add_constant(
        "w",
        Arc::new(ir::random_tensor(&TensorType::new(DType::F32, vec![4, 4]), 3, -1.0, 1.0)),
        origin("w"),
    );
    let p = g.add_op(Op::MatMul, &[x, w], "p", origin("p")).unwrap();
    let t = g.add_op(Op::Unary(UnaryOp::Tanh), &[p], "t", origin("t")).unwrap();
    let r = g.add_op(Op::Reshape { shape: vec![3, 2, 4] }, &[t], "r", origin("r")).unwrap();
    let y = g
        .add_op(
            Op::Slice { axes: vec![SliceAxis { start: 1, step: 1, len: 1 }, all(2), all(4)] },
            &[r],
            "y",
            origin("y"),
        )
        .unwrap();
    // z reads the product whole: the slice stops there.
    let z = g.add_op(Op::Unary(UnaryOp::Neg), &[p], "z", origin("z")).unwrap();
    g.set_outputs(vec![("y".into(), y), ("z".into(), z)]);
    let feeds: HashMap<_, _> =
        [("x".to_string(), ir::random_tensor(&TensorType::new(DType::F32, vec![6, 4]), 5, -1.0, 1.0))].into();
    let before = ir::evaluate(&g, &feeds).unwrap();
    let moved = SliceEarly.run(&mut g).unwrap();
    Dce.run(&mut g).unwrap();
    ir::verify(&g).unwrap();
    let after = ir::evaluate(&g, &feeds).unwrap();
    for ((name, a), (_, b)) in after.iter().zip(&before) {
        assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{name}");
    }
    // Through the reshape (rows 2..4 of the [6, 4] tanh) and the tanh, not past the product.
    assert_eq!(moved, 2);
    let tanh = g.node_ids().find(|&id| g.node(id).op.kind() == "Tanh").unwrap();
    assert_eq!(g.node(tanh).ty.shape, [2, 4]);
    let cut = g.inputs_of(tanh)[0];
    assert_eq!(g.node(cut).op, Op::Slice { axes: vec![SliceAxis { start: 2, step: 1, len: 2 }, all(4)] });
    assert_eq!(g.inputs_of(cut), [p]);
}

/// A reduction over the last axes (a global pool over NCHW) is one row reduction over their
/// run, through reshapes, unless its rows are few and long; over other axes (NHWC's spatial
/// ones) one reduction per axis. All keep their values, with and without the reduced axes
/// kept.
#[test]
fn a_pool_over_the_last_axes_is_one_row_reduction() {
    use fusec::ir::ReduceOp;
    use fusec::passes::SplitReductions;
    // The last case: two rows of 12,288 elements, split (a block a row would idle the GPU).
    let cases = [
        (vec![2, 3, 5, 7], vec![2, 3], true, 1),
        (vec![2, 3, 5, 7], vec![3, 2], false, 1),
        (vec![2, 3, 5, 7], vec![1, 2, 3], true, 1),
        (vec![2, 3, 5, 7], vec![1, 2], true, 2),
        (vec![2, 3, 64, 64], vec![1, 2, 3], true, 3),
    ];
    for (shape, axes, keep_dims, reductions) in cases {
        let mut g = Graph::new();
        let ty = TensorType::new(DType::F32, shape.clone());
        let x = g.add_input("x", ty.clone());
        let op = Op::Reduce { op: ReduceOp::Mean, axes: axes.clone(), keep_dims };
        let pool = g.add_op(op, &[x], "pool", origin("pool")).unwrap();
        g.set_outputs(vec![("pool".into(), pool)]);
        let feeds: HashMap<_, _> = [("x".to_string(), ir::random_tensor(&ty, 7, -1.0, 1.0))].into();
        let before = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(SplitReductions.run(&mut g).unwrap(), 1);
        ir::verify(&g).unwrap();
        let after = ir::evaluate(&g, &feeds).unwrap();
        assert_eq!(after[0].1.shape(), before[0].1.shape(), "{axes:?}");
        let err = rel_l2(&after[0].1, &before[0].1);
        assert!(err <= 1e-6, "{axes:?}: rel-L2 {err:e}");
        let reduces: Vec<Op> = g
            .node_ids()
            .map(|id| g.node(id).op.clone())
            .filter(|op| matches!(op, Op::Reduce { .. }))
            .collect();
        assert_eq!(reduces.len(), reductions, "{axes:?}: {reduces:?}");
        if reductions == 1 {
            // Over the run's one axis of a [2, 3, 35] (or [2, 105]) view.
            let Op::Reduce { axes: ref one, .. } = reduces[0] else { unreachable!() };
            assert_eq!(one.len(), 1);
            let input = g.node_ids().find(|&id| matches!(g.node(id).op, Op::Reduce { .. })).unwrap();
            let rows = &g.node(g.inputs_of(input)[0]).ty.shape;
            assert_eq!(rows.iter().product::<usize>(), shape.iter().product::<usize>(), "{rows:?}");
            assert_eq!(rows.len(), one[0] + 1, "{rows:?}");
        }
    }
}

/// A product of a constant over one element (`[2, 3, 1] · [1, 1, 4]`, the batch broadcast
/// too: a rotary embedding's frequencies times its positions) is a broadcast Mul with the
/// product's values; one over two elements (`[3, 2] · [2, 4]`), a vector's (`[1] · [1, 4]`)
/// and one of two computed values (attention's weights times its values at one key) stay
/// MatMuls.
#[test]
fn a_product_over_one_element_is_a_broadcast_mul() {
    let mut g = Graph::new();
    let constant = |g: &mut Graph, name: &str, shape: Vec<usize>, seed: u64| {
        let value = ir::random_tensor(&TensorType::new(DType::F32, shape), seed, -1.0, 2.0);
        g.add_constant(name, Arc::new(value), origin(name))
    };
    let a = constant(&mut g, "a", vec![2, 3, 1], 11);
    let c = constant(&mut g, "c", vec![3, 2], 12);
    let e = constant(&mut g, "e", vec![1], 13);
    let inputs: [(&str, Vec<usize>); 5] = [
        ("b", vec![1, 1, 4]),
        ("d", vec![2, 4]),
        ("f", vec![1, 4]),
        ("w", vec![2, 3, 1]),
        ("z", vec![1, 1, 4]),
    ];
    let ids: Vec<_> = inputs
        .iter()
        .map(|(name, shape)| g.add_input(name, TensorType::new(DType::F32, shape.clone())))
        .collect();
    let outer = g.add_op(Op::MatMul, &[a, ids[0]], "outer", origin("outer")).unwrap();
    let inner = g.add_op(Op::MatMul, &[c, ids[1]], "inner", origin("inner")).unwrap();
    let vector = g.add_op(Op::MatMul, &[e, ids[2]], "vector", origin("vector")).unwrap();
    let computed = g.add_op(Op::MatMul, &[ids[3], ids[4]], "computed", origin("computed")).unwrap();
    let products = [outer, inner, vector, computed];
    g.set_outputs(products.iter().map(|&p| (g.node(p).name.clone(), p)).collect());
    let feeds: HashMap<_, _> = inputs
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            (
                name.to_string(),
                ir::random_tensor(&TensorType::new(DType::F32, shape.clone()), 21 + i as u64, -1.0, 2.0),
            )
        })
        .collect();
    let before = ir::evaluate(&g, &feeds).unwrap();
    assert_eq!(OuterProducts.run(&mut g).unwrap(), 1);
    ir::verify(&g).unwrap();
    assert_eq!(
        products.map(|id| g.node(id).op.clone()),
        [Op::Binary(BinaryOp::Mul), Op::MatMul, Op::MatMul, Op::MatMul]
    );
    let after = ir::evaluate(&g, &feeds).unwrap();
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert!(rel_l2(a, b) < 1e-6, "{name}: {}", rel_l2(a, b));
    }
}

/// A rotary embedding's table as Llama's exporters write it (positions cast to f32 times the
/// inverse frequencies, a product over one element, transposed, concatenated with itself;
/// cosines and sines) turning a value, at positions 1,000 to 1,006: lowered to f16 and to
/// bf16, its angles stay f32 (rounded to f16 they are off by up to half a radian there, and
/// bf16 does not hold the positions) and the result is within the type's rounding of f32.
#[test]
fn rotary_angles_stay_f32_in_half_type_graphs() {
    for precision in [DType::F16, DType::BF16] {
        rotary_angles_stay_f32(precision);
    }
}

fn rotary_angles_stay_f32(precision: DType) {
    let (s, half) = (7usize, 8usize);
    let mut g = Graph::new();
    let positions = g.add_input("positions", TensorType::new(DType::I64, vec![1, s]));
    let x = g.add_input("x", TensorType::new(DType::F32, vec![1, s, 2 * half]));
    let inv: Vec<f64> = (0..half).map(|i| 10000f64.powf(-(i as f64) / half as f64)).collect();
    let inv = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[1, half, 1]), inv).unwrap();
    let inv = g.add_constant("inv_freq", Arc::new(Tensor::from_f64(inv, DType::F32)), origin("inv_freq"));
    let op =
        |g: &mut Graph, op: Op, inputs: &[_], name: &str| g.add_op(op, inputs, name, origin(name)).unwrap();
    let p = op(&mut g, Op::Cast { to: DType::F32 }, &[positions], "cast");
    let p = op(&mut g, Op::Reshape { shape: vec![1, 1, s] }, &[p], "unsqueeze");
    let freqs = op(&mut g, Op::MatMul, &[inv, p], "freqs");
    let freqs = op(&mut g, Op::Transpose { perm: vec![0, 2, 1] }, &[freqs], "transpose");
    let emb = op(&mut g, Op::Concat { axis: 2 }, &[freqs, freqs], "emb");
    let cos = op(&mut g, Op::Unary(UnaryOp::Cos), &[emb], "cos");
    let sin = op(&mut g, Op::Unary(UnaryOp::Sin), &[emb], "sin");
    let a = op(&mut g, Op::Binary(BinaryOp::Mul), &[x, cos], "x_cos");
    let b = op(&mut g, Op::Binary(BinaryOp::Mul), &[x, sin], "x_sin");
    let y = op(&mut g, Op::Binary(BinaryOp::Add), &[a, b], "y");
    g.set_outputs(vec![("y".into(), y)]);
    let at: Vec<i64> = (0..s as i64).map(|i| 1000 + i).collect();
    let at = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[1, s]), at).unwrap();
    let feeds: HashMap<_, _> = [
        ("positions".to_string(), Tensor::from_i64(at, DType::I64)),
        (
            "x".to_string(),
            ir::random_tensor(&TensorType::new(DType::F32, vec![1, s, 2 * half]), 3, -1.0, 2.0),
        ),
    ]
    .into();
    let reference = ir::evaluate(&g, &feeds).unwrap();
    // As compilation runs them: the passes (the product over one element a Mul), then lowering.
    assert_eq!(OuterProducts.run(&mut g).unwrap(), 1);
    let (lowered, map) = fusec::passes::lower_precision(g, precision).unwrap();
    let dtype = |id| lowered.node(map[&id]).ty.dtype;
    assert_eq!([freqs, emb].map(dtype), [DType::F32; 2], "{precision}");
    let angle = lowered.node_ids().find(|&n| lowered.node(n).op == Op::Unary(UnaryOp::Cos)).unwrap();
    assert_eq!(lowered.node(lowered.inputs_of(angle)[0]).ty.dtype, DType::F32, "{precision}");
    if precision == DType::F16 {
        assert_eq!([x, a, y].map(dtype), [DType::F16; 3]);
    } else {
        // The bf16 policy rounds the sines and cosines where the (f32) value reads them.
        assert_eq!([cos, sin].map(dtype), [DType::BF16; 2]);
    }
    let out = ir::evaluate(&lowered, &feeds).unwrap();
    let err = rel_l2(&out[0].1, &reference[0].1);
    let bound = if precision == DType::F16 { 2e-3 } else { 1e-2 };
    assert!(err < bound, "{precision}: rel-L2 {err:e} against f32");
}

/// A concatenation of one value with itself (three copies along axis 1) is a Tile with its
/// values; one of two values stays a Concat.
#[test]
fn a_value_concatenated_with_itself_is_a_tile() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3, 5]));
    let y = g.add_input("y", TensorType::new(DType::F32, vec![2, 3, 5]));
    let tiled = g.add_op(Op::Concat { axis: 1 }, &[x, x, x], "tiled", origin("tiled")).unwrap();
    let joined = g.add_op(Op::Concat { axis: 2 }, &[x, y], "joined", origin("joined")).unwrap();
    g.set_outputs(vec![("tiled".into(), tiled), ("joined".into(), joined)]);
    let ty = TensorType::new(DType::F32, vec![2, 3, 5]);
    let feeds: HashMap<_, _> = [
        ("x".to_string(), ir::random_tensor(&ty, 31, -1.0, 2.0)),
        ("y".to_string(), ir::random_tensor(&ty, 32, -1.0, 2.0)),
    ]
    .into();
    let before = ir::evaluate(&g, &feeds).unwrap();
    assert_eq!(RepeatsAsTiles.run(&mut g).unwrap(), 1);
    ir::verify(&g).unwrap();
    let ops = g.op_histogram();
    assert_eq!((ops.get("Tile"), ops.get("Concat")), (Some(&1), Some(&1)), "{ops:?}");
    let after = ir::evaluate(&g, &feeds).unwrap();
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(a.to_f64_vec(), b.to_f64_vec(), "{name}");
    }
}

/// T5's relative-position buckets (`exact + log(distance / exact) / log(max / exact) ·
/// (buckets − exact)`, cast to an integer), lowered to f16: the float computation stays f32,
/// so every distance gets the bucket the f32 graph gives it (in f16 the logarithms' rounding
/// moves some across a boundary).
#[test]
fn index_computations_stay_f32_in_an_f16_graph() {
    let n = 200usize;
    let mut g = Graph::new();
    let distance = g.add_input("distance", TensorType::new(DType::I64, vec![n]));
    let scalar = |g: &mut Graph, name: &str, v: f64| {
        let value = Tensor::from_f64(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), v), DType::F32);
        g.add_constant(name, Arc::new(value), origin(name))
    };
    let (exact, scale, offset) =
        (scalar(&mut g, "exact", 8.0), scalar(&mut g, "scale", 8.0), scalar(&mut g, "offset", 8.0));
    let log_range = scalar(&mut g, "log_range", (128f64 / 8.0).ln());
    let op =
        |g: &mut Graph, op: Op, inputs: &[_], name: &str| g.add_op(op, inputs, name, origin(name)).unwrap();
    let d = op(&mut g, Op::Cast { to: DType::F32 }, &[distance], "cast");
    let d = op(&mut g, Op::Binary(BinaryOp::Div), &[d, exact], "over_exact");
    let d = op(&mut g, Op::Unary(UnaryOp::Log), &[d], "log");
    let d = op(&mut g, Op::Binary(BinaryOp::Div), &[d, log_range], "over_range");
    let d = op(&mut g, Op::Binary(BinaryOp::Mul), &[d, scale], "scaled");
    let d = op(&mut g, Op::Binary(BinaryOp::Add), &[d, offset], "shifted");
    let bucket = op(&mut g, Op::Cast { to: DType::I64 }, &[d], "bucket");
    g.set_outputs(vec![("bucket".into(), bucket)]);
    let distances =
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[n]), (8..8 + n as i64).collect()).unwrap();
    let feeds: HashMap<_, _> = [("distance".to_string(), Tensor::from_i64(distances, DType::I64))].into();
    let reference = ir::evaluate(&g, &feeds).unwrap();
    let (lowered, map) = fusec::passes::lower_precision(g, DType::F16).unwrap();
    assert_eq!(lowered.node(lowered.inputs_of(map[&bucket])[0]).ty.dtype, DType::F32);
    let out = ir::evaluate(&lowered, &feeds).unwrap();
    assert_eq!(out[0].1.to_f64_vec(), reference[0].1.to_f64_vec());
}
