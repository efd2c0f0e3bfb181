//! The IR on its own: building, verifying, dumping and evaluating graphs.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use fusec::import::{import, ImportOptions};
use fusec::ir::{self, BinaryOp, DType, Graph, IrError, Op, Origin, Tensor, TensorType, UnaryOp};
use ndarray::{ArrayD, IxDyn};

fn origin(name: &str) -> Origin {
    Origin::new(name, "Test")
}

/// y = softmax(x + bias) over the last axis, for a [2, 3] input.
fn small_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3]));
    let bias = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0.5, -1.0, 2.0]).unwrap());
    let b = g.add_constant("bias", Arc::new(bias), origin("bias"));
    let sum = g.add_op(Op::Binary(BinaryOp::Add), &[x, b], "sum", origin("add")).unwrap();
    let y = g.add_op(Op::Softmax { axis: 1 }, &[sum], "y", origin("softmax")).unwrap();
    g.set_outputs(vec![("y".into(), y)]);
    g
}

#[test]
fn a_small_graph_verifies_and_dumps() {
    let g = small_graph();
    ir::verify(&g).unwrap();
    insta::assert_snapshot!(ir::dump(&g).unwrap());
}

#[test]
fn the_evaluator_computes_softmax_of_a_sum() {
    let g = small_graph();
    let x =
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, 2.0, 3.0, -1.0, 0.0, 0.25]).unwrap());
    let out = ir::evaluate(&g, &HashMap::from([("x".to_string(), x)])).unwrap();
    let y = out[0].1.to_f64_vec();
    // Row 0: softmax([1.5, 1.0, 5.0]) computed by hand in f64.
    let row: Vec<f64> = [1.5f64, 1.0, 5.0].iter().map(|v| v.exp()).collect();
    let total: f64 = row.iter().sum();
    for (got, want) in y[..3].iter().zip(row.iter().map(|v| v / total)) {
        assert!((got - want).abs() < 1e-7, "{got} vs {want}");
    }
    assert!((y[3..].iter().sum::<f64>() - 1.0).abs() < 1e-6);
}

#[test]
fn type_errors_name_the_node() {
    let mut g = Graph::new();
    let a = g.add_input("a", TensorType::new(DType::F32, vec![2, 3]));
    let b = g.add_input("b", TensorType::new(DType::F32, vec![4, 3]));
    let err = g.add_op(Op::Binary(BinaryOp::Mul), &[a, b], "c", origin("the_mul")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("the_mul") && text.contains("do not broadcast"), "{text}");
    let err = g.add_op(Op::MatMul, &[a, b], "c", origin("the_matmul")).unwrap_err();
    assert!(err.to_string().contains("the_matmul"), "{err}");
}

#[test]
fn the_verifier_catches_a_wrong_stored_type() {
    let mut g = small_graph();
    let y = g.outputs()[0].1;
    g.node_mut(y).ty = TensorType::new(DType::F32, vec![3, 2]);
    let err = ir::verify(&g).unwrap_err();
    assert!(matches!(err, IrError::Verify { ref node, .. } if node == "softmax"), "{err}");
}

#[test]
fn the_verifier_catches_a_wrong_arity() {
    let mut g = small_graph();
    let y = g.outputs()[0].1;
    g.node_mut(y).op = Op::Binary(BinaryOp::Add);
    let err = ir::verify(&g).unwrap_err().to_string();
    assert!(err.contains("softmax") && err.contains("takes 2 inputs, got 1"), "{err}");
}

#[test]
fn the_evaluator_checks_its_inputs() {
    let g = small_graph();
    let err = ir::evaluate(&g, &HashMap::new()).unwrap_err().to_string();
    assert!(err.contains("'x' was not given") && err.contains("x f32[2,3]"), "{err}");
    let wrong = Tensor::F32(ArrayD::zeros(IxDyn(&[3, 2])));
    let err = ir::evaluate(&g, &HashMap::from([("x".to_string(), wrong.clone())])).unwrap_err();
    assert!(err.to_string().contains("f32[3,2]"), "{err}");
    let err = ir::evaluate(
        &g,
        &HashMap::from([("x".to_string(), wrong.cast(DType::F32)), ("z".to_string(), wrong)]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("'z' is not an input"), "{err}");
}

#[test]
fn unary_ops_on_awkward_values() {
    let mut g = Graph::new();
    let x = g.add_input("x", TensorType::new(DType::F32, vec![5]));
    let gelu = g.add_op(Op::Unary(UnaryOp::Gelu), &[x], "g", origin("gelu")).unwrap();
    let nan = g.add_op(Op::Unary(UnaryOp::IsNaN), &[gelu], "n", origin("isnan")).unwrap();
    g.set_outputs(vec![("g".into(), gelu), ("n".into(), nan)]);
    let input =
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[5]), vec![-3.0, -0.5, 0.0, 1.0, f32::NAN]).unwrap());
    let out = ir::evaluate(&g, &HashMap::from([("x".to_string(), input)])).unwrap();
    let gelu = out[0].1.to_f64_vec();
    // 0.5·x·(1 + erf(x/√2)) at x = 1 is 0.841344746…
    assert!((gelu[3] - 0.841_344_746).abs() < 1e-6, "{gelu:?}");
    assert!(gelu[4].is_nan());
    assert_eq!(out[1].1.to_i64_vec(), vec![0, 0, 0, 0, 1]);
}

/// The dump of an imported model is stable: a golden file per decomposed-LayerNorm variant.
#[test]
fn imported_dumps_are_stable() {
    for file in ["layernorm_div.onnx", "gelu_tanh.onnx"] {
        let model = import(&common::model_path(file), &ImportOptions::default().dim("batch", 2)).unwrap();
        insta::assert_snapshot!(file, ir::dump(&model.graph).unwrap());
    }
}
