//! Import keeps the model's meaning: for every fixture in models/, at several shapes, the IR
//! reference evaluator on the imported graph matches tract running the original ONNX file.

mod common;

use std::collections::HashMap;

use fusec::import::{import, run_tract};
use fusec::ir::{self, max_abs_diff, rel_l2};

const TOLERANCE: f64 = 1e-5;

fn check_against_tract(file: &str) {
    let path = common::model_path(file);
    for (variant, options) in common::shape_variants(file).into_iter().enumerate() {
        let model = import(&path, &options).unwrap_or_else(|e| panic!("{e}"));
        let inputs = common::random_inputs(&model, 17 + variant as u64);
        let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
        let ours = ir::evaluate(&model.graph, &feeds).unwrap_or_else(|e| panic!("{file}: {e}"));
        let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
        let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ours.len(), theirs.len(), "{file}: output count");
        for ((name, a), b) in ours.iter().zip(&theirs) {
            assert_eq!(a.shape(), b.shape(), "{file} {name}: shape");
            let err = rel_l2(a, b);
            assert!(
                err <= TOLERANCE,
                "{file} {options:?} output {name}: rel-L2 {err:e} (max abs {:e}) exceeds {TOLERANCE:e}",
                max_abs_diff(a, b)
            );
            assert!(b.to_f64_vec().iter().any(|&v| v != 0.0), "{file} {name}: reference output is all zeros");
        }
    }
}

macro_rules! reference_tests {
    ($($name:ident => $file:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            check_against_tract($file);
        }
    )*
        /// Every fixture in models/ has a test here.
        #[test]
        fn every_fixture_is_covered() {
            let covered = [$($file),*];
            for file in common::all_fixtures() {
                assert!(covered.contains(&file.as_str()), "models/{file} has no reference test");
            }
        }
    };
}

reference_tests! {
    bert_ts => "bert_ts.onnx",
    bert_dynamo => "bert_dynamo.onnx",
    bert12_ts => "bert12_ts.onnx",
    bert_mask_ts => "bert_mask_ts.onnx",
    bert_mask_dynamo => "bert_mask_dynamo.onnx",
    gpt2_ts => "gpt2_ts.onnx",
    gpt2_mask_ts => "gpt2_mask_ts.onnx",
    gpt2_mask_dynamo => "gpt2_mask_dynamo.onnx",
    gpt2_dynamo => "gpt2_dynamo.onnx",
    llama_ts => "llama_ts.onnx",
    llama_dynamo => "llama_dynamo.onnx",
    vit_ts => "vit_ts.onnx",
    vit_dynamo => "vit_dynamo.onnx",
    vit_tv_ts => "vit_tv_ts.onnx",
    vit_tv_dynamo => "vit_tv_dynamo.onnx",
    mlp_block => "mlp_block.onnx",
    layernorm_div => "layernorm_div.onnx",
    layernorm_reciprocal => "layernorm_reciprocal.onnx",
    layernorm_ex2 => "layernorm_ex2.onnx",
    rmsnorm => "rmsnorm.onnx",
    gelu_erf_div => "gelu_erf_div.onnx",
    gelu_erf_mul => "gelu_erf_mul.onnx",
    gelu_tanh => "gelu_tanh.onnx",
    gelu_op => "gelu_op.onnx",
    softmax_decomposed => "softmax_decomposed.onnx",
    op_coverage => "op_coverage.onnx",
    attention_d64 => "attention_d64.onnx",
    attention_gqa_d80 => "attention_gqa_d80.onnx",
    cnn_block => "cnn_block.onnx",
    gpt2_cache_ts => "gpt2_cache_ts.onnx",
    llama_cache_ts => "llama_cache_ts.onnx",
    gpt2_cache_dynamo => "gpt2_cache_dynamo.onnx",
    llama_cache_dynamo => "llama_cache_dynamo.onnx",
}
