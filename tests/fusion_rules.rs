//! Each rule, egg style: a start expression must be proved equal to a goal, and a near miss
//! must not be. Leaves: `in0`… are the inputs below, `c0`… the constants below, in order.

use std::sync::Arc;

use egg::{RecExpr, Runner};
use fusec::fusion::{rules, FusionAnalysis, FusionGraph, FusionLang};
use fusec::ir::{random_tensor, DType, Op, ReduceOp, SliceAxis, Tensor, TensorType};
use ndarray::{ArrayD, IxDyn};

fn f32s(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// in0 x [2,3,8]; in1 y [2,3,8]; in2 q [2,4,5,8]; in3 kt [2,4,8,5]; in4 v [2,4,5,8].
/// c0 0.5; c1 1; c2 2; c3 1e-5; c4 1/√2; c5 3; c6 0.044715; c7 √(2/π); c8 0 (scalar);
/// c9 γ [8]; c10 β [8]; c11 additive causal mask [5,5]; c12 1/1.5 (not a GELU constant);
/// c13 ones [4,2,3,8] (broadcasts x up); c14 zeros [2,4,5,5]; c15 causal keep [5,5] (bool);
/// c16 fill -inf [] ; c17 0.25; c18 γ [3] (wrong width).
/// op0 ReduceMean over axis 1 (not the last); op1 x[.., 4:8] and op2 x[.., 0:4] of a
/// [2,3,8]; op3 Concat over the last axis; op4 Concat over axis 1.
fn analysis() -> FusionAnalysis {
    let mut a = FusionAnalysis::default();
    for (name, shape) in [
        ("x", [2, 3, 8].as_slice()),
        ("y", &[2, 3, 8]),
        ("q", &[2, 4, 5, 8]),
        ("kt", &[2, 4, 8, 5]),
        ("v", &[2, 4, 5, 8]),
    ] {
        a.add_input(name, f32s(shape));
    }
    let scalar = |v: f32| Tensor::scalar_f32(v);
    let causal = |keep: f64, drop: f64| {
        ArrayD::from_shape_fn(IxDyn(&[5, 5]), |i| if i[1] <= i[0] { keep } else { drop })
    };
    let constants = vec![
        scalar(0.5),
        scalar(1.0),
        scalar(2.0),
        scalar(1e-5),
        scalar(std::f32::consts::FRAC_1_SQRT_2),
        scalar(3.0),
        scalar(0.044715),
        scalar(0.797_884_6),
        scalar(0.0),
        random_tensor(&f32s(&[8]), 1, 0.5, 1.5),
        random_tensor(&f32s(&[8]), 2, -0.5, 0.5),
        Tensor::from_f64(causal(0.0, f64::NEG_INFINITY), DType::F32),
        scalar(1.0 / 1.5),
        Tensor::full(&f32s(&[4, 2, 3, 8]), 1.0),
        Tensor::full(&f32s(&[2, 4, 5, 5]), 0.0),
        Tensor::Bool(causal(1.0, 0.0).mapv(|v| v != 0.0)),
        scalar(f32::NEG_INFINITY),
        scalar(0.25),
        random_tensor(&f32s(&[3]), 3, 0.5, 1.5),
    ];
    for (i, c) in constants.into_iter().enumerate() {
        let id = a.intern_constant(Arc::new(c));
        assert_eq!(id.0 as usize, i, "constants must intern in order");
    }
    a.intern_op(Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keep_dims: true });
    let whole = |len: usize| SliceAxis { start: 0, step: 1, len };
    for start in [4, 0] {
        a.intern_op(Op::Slice { axes: vec![whole(2), whole(3), SliceAxis { start, step: 1, len: 4 }] });
    }
    a.intern_op(Op::Concat { axis: 2 });
    a.intern_op(Op::Concat { axis: 1 });
    a
}

/// Saturates `start` with every rule and says whether `goal` is in its class.
fn proves(start: &str, goal: &str) -> bool {
    let start: RecExpr<FusionLang> = start.parse().unwrap_or_else(|e| panic!("{start}: {e}"));
    let goal: RecExpr<FusionLang> = goal.parse().unwrap_or_else(|e| panic!("{goal}: {e}"));
    let mut egraph = FusionGraph::new(analysis());
    let root = egraph.add_expr(&start);
    let runner = Runner::default()
        .with_egraph(egraph)
        .with_iter_limit(30)
        .with_node_limit(20_000)
        .with_time_limit(std::time::Duration::from_secs(5))
        .run(&rules::all());
    let root = runner.egraph.find(root);
    runner.egraph.lookup_expr(&goal).map(|g| runner.egraph.find(g)) == Some(root)
}

macro_rules! rewrites {
    ($($name:ident: $start:literal => $goal:literal;)*) => {
        $(
            #[test]
            fn $name() {
                assert!(proves($start, $goal), "{} should become {}", $start, $goal);
            }
        )*
        /// Every start expression above, for the check that each rule is exercised.
        const STARTS: &[&str] = &[$($start),*];
    };
}

macro_rules! near_misses {
    ($($name:ident: $start:literal =/=> $goal:literal;)*) => {$(
        #[test]
        fn $name() {
            assert!(!proves($start, $goal), "{} must not become {}", $start, $goal);
        }
    )*};
}

// The decomposed LayerNorm of layernorm_div.onnx: Sub, Pow 2, mean, + eps, Sqrt, Div, γ, β.
const LN_DIV: &str = "(+ (* (/ (- in0 (mean in0)) (sqrt (+ (mean (pow (- in0 (mean in0)) c2)) c3))) c9) c10)";

rewrites! {
    layer_norm_div_affine: "(+ (* (/ (- in0 (mean in0)) (sqrt (+ (mean (pow (- in0 (mean in0)) c2)) c3))) c9) c10)"
        => "(layer_norm in0 c9 c10 c3)";
    layer_norm_reciprocal_no_affine: "(* (- in0 (mean in0)) (recip (sqrt (+ (mean (* (- in0 (mean in0)) (- in0 (mean in0)))) c3))))"
        => "(layer_norm in0 none none c3)";
    layer_norm_e_x2_eps_first_gamma_first: "(+ c10 (* c9 (* (- in0 (mean in0)) (recip (sqrt (+ c3 (- (mean (* in0 in0)) (* (mean in0) (mean in0)))))))))"
        => "(layer_norm in0 c9 c10 c3)";
    rms_norm_llama: "(* c9 (* in0 (recip (sqrt (+ (mean (pow in0 c2)) c3)))))" => "(rms_norm in0 c9 c3)";
    rotate_half: "(op3 (neg (op1 in0)) (op2 in0))" => "(rotate_half in0)";
    rms_norm_div: "(/ in0 (sqrt (+ (mean (* in0 in0)) c3)))" => "(rms_norm in0 none c3)";
    gelu_erf_div_sqrt2: "(* (* in0 (+ (erf (/ in0 c4)) c1)) c0)" => "(* (* in0 (+ (erf (* in0 (recip c4))) c1)) c0)";
    gelu_erf_div: "(* (* in0 (+ (erf (* in0 c4)) c1)) c0)" => "(gelu in0)";
    gelu_erf_half_first: "(* (* c0 in0) (+ c1 (erf (* in0 c4))))" => "(gelu in0)";
    gelu_erf_sum_first: "(* (+ (erf (* c4 in0)) c1) (* in0 c0))" => "(gelu in0)";
    gelu_tanh_gpt2: "(* (* c0 in0) (+ c1 (tanh (* c7 (+ in0 (* c6 (pow in0 c5)))))))" => "(gelu_tanh in0)";
    softmax_shifted: "(/ (exp (- in0 (max in0))) (sum (exp (- in0 (max in0)))))" => "(softmax in0)";
    softmax_unshifted: "(/ (exp in0) (sum (exp in0)))" => "(softmax in0)";
    attention_scale_on_scores: "(matmul (softmax (+ (* (matmul in2 in3) c17) c11)) in4)" => "(attention in2 in3 in4 c11 c17)";
    attention_scale_on_q_and_k: "(matmul (softmax (+ (matmul (* in2 c0) (* in3 c0)) c11)) in4)" => "(attention in2 in3 in4 c11 c17)";
    attention_scale_divides_scores: "(matmul (softmax (/ (matmul in2 in3) c2)) in4)" => "(attention in2 in3 in4 none c0)";
    attention_unscaled: "(matmul (softmax (+ (matmul in2 in3) c11)) in4)" => "(attention in2 in3 in4 c11 c1)";
    attention_nan_guard: "(matmul (where (isnan (softmax (+ (* (matmul in2 in3) c0) c11))) c8 (softmax (+ (* (matmul in2 in3) c0) c11))) in4)"
        => "(attention_nan0 in2 in3 in4 c11 c0)";
    dropout_is_removed: "(dropout in0)" => "in0";
    identity_is_removed: "(+ (identity in0) in1)" => "(+ in0 in1)";
    mul_by_one: "(* in0 c1)" => "in0";
    add_zero: "(+ c8 in0)" => "in0";
    transpose_pair_cancels: "(transpose (transpose in2 perm0.2.1.3) perm0.2.1.3)" => "in2";
    transpose_pair_composes: "(transpose (transpose in2 perm0.2.1.3) perm0.1.3.2)" => "(transpose in2 perm0.2.3.1)";
    constants_fold: "(* in0 (* c0 c2))" => "in0";
    scale_out_of_right_factor: "(* in1 (* in0 c0))" => "(* (* in1 in0) c0)";
    layer_norm_rstd_first: "(* (recip (sqrt (+ (mean (* (- in0 (mean in0)) (- in0 (mean in0)))) c3))) (- in0 (mean in0)))"
        => "(layer_norm in0 none none c3)";
    rms_norm_rstd_first: "(* (recip (sqrt (+ (mean (* in0 in0)) c3))) in0)" => "(rms_norm in0 none c3)";
    gelu_tanh_sum_first: "(* (* (+ (tanh (* (+ in0 (* (pow in0 c5) c6)) c7)) c1) in0) c0)" => "(gelu_tanh in0)";
    gelu_tanh_cube_first: "(* (* in0 (+ (tanh (* (+ (* (pow in0 c5) c6) in0) c7)) c1)) c0)" => "(gelu_tanh in0)";
    attention_nan_guard_unmasked: "(matmul (where (isnan (softmax (* (matmul in2 in3) c0))) c8 (softmax (* (matmul in2 in3) c0))) in4)"
        => "(attention_nan0 in2 in3 in4 none c0)";
}

near_misses! {
    layer_norm_wrong_reduce_axis: "(* (- in0 (op0 in0)) (recip (sqrt (+ (op0 (* (- in0 (op0 in0)) (- in0 (op0 in0)))) c3))))"
        =/=> "(layer_norm in0 none none c3)";
    layer_norm_eps_outside_sqrt: "(/ (- in0 (mean in0)) (+ (sqrt (mean (* (- in0 (mean in0)) (- in0 (mean in0))))) c3))"
        =/=> "(layer_norm in0 none none c3)";
    layer_norm_other_tensor_centred: "(/ (- in1 (mean in0)) (sqrt (+ (mean (* (- in0 (mean in0)) (- in0 (mean in0)))) c3)))"
        =/=> "(layer_norm in0 none none c3)";
    layer_norm_gamma_of_wrong_width: "(* (/ (- in0 (mean in0)) (sqrt (+ (mean (* (- in0 (mean in0)) (- in0 (mean in0)))) c3))) c18)"
        =/=> "(layer_norm in0 c18 none c3)";
    rms_norm_mean_of_other_square: "(* in0 (recip (sqrt (+ (mean (* in1 in1)) c3))))" =/=> "(rms_norm in0 none c3)";
    gelu_wrong_constant: "(* (* in0 (+ (erf (* in0 c12)) c1)) c0)" =/=> "(gelu in0)";
    gelu_wrong_half: "(* (* in0 (+ (erf (* in0 c4)) c1)) c1)" =/=> "(gelu in0)";
    gelu_tanh_is_not_exact_gelu: "(* (* c0 in0) (+ c1 (tanh (* c7 (+ in0 (* c6 (pow in0 c5)))))))" =/=> "(gelu in0)";
    exact_gelu_is_not_tanh_gelu: "(* (* in0 (+ (erf (* in0 c4)) c1)) c0)" =/=> "(gelu_tanh in0)";
    softmax_sum_of_other_exp: "(/ (exp in0) (sum (exp in1)))" =/=> "(softmax in0)";
    attention_softmax_over_wrong_axis: "(matmul (op0 (* (matmul in2 in3) c0)) in4)" =/=> "(attention in2 in3 in4 none c0)";
    attention_mask_of_wrong_shape: "(matmul (softmax (+ (* (matmul in2 in3) c0) c9)) in4)" =/=> "(attention in2 in3 in4 c9 c0)";
    mul_by_broadcasting_ones: "(* in0 c13)" =/=> "in0";
    nan_guard_with_nonzero_fill: "(where (isnan (softmax in0)) c1 (softmax in0))" =/=> "(softmax_nan0 in0)";
    add_nonzero_is_kept: "(+ in0 c1)" =/=> "in0";
    cube_is_not_square: "(pow in0 c5)" =/=> "(* in0 in0)";
    transpose_pair_that_does_not_cancel: "(transpose (transpose in2 perm0.2.1.3) perm0.1.3.2)" =/=> "in2";
    softmax_max_of_other_tensor: "(/ (exp (- in0 (max in1))) (sum (exp (- in0 (max in1)))))" =/=> "(softmax in0)";
    attention_scale_not_scalar: "(matmul (softmax (* (matmul in2 in3) c14)) in4)" =/=> "(attention in2 in3 in4 none c14)";
    rotate_half_halves_in_place: "(op3 (neg (op2 in0)) (op1 in0))" =/=> "(rotate_half in0)";
    rotate_half_without_negation: "(op3 (op1 in0) (op2 in0))" =/=> "(rotate_half in0)";
    rotate_half_of_two_tensors: "(op3 (neg (op1 in0)) (op2 in1))" =/=> "(rotate_half in0)";
    rotate_half_concat_over_other_axis: "(op4 (neg (op1 in0)) (op2 in0))" =/=> "(rotate_half in0)";
    rms_norm_eps_outside_sqrt: "(* in0 (recip (+ (sqrt (mean (* in0 in0))) c3)))" =/=> "(rms_norm in0 none c3)";
}

/// Every rule fires on at least one of the start expressions above: none is untested.
#[test]
fn every_rule_is_exercised() {
    let mut fired = std::collections::HashSet::new();
    for start in STARTS.iter().chain([&CAUSAL_WHERE]) {
        let expr: RecExpr<FusionLang> = start.parse().unwrap();
        let mut egraph = FusionGraph::new(analysis());
        egraph.add_expr(&expr);
        let runner = Runner::default().with_egraph(egraph).with_iter_limit(30).run(&rules::all());
        for iteration in &runner.iterations {
            fired.extend(iteration.applied.keys().map(|name| name.to_string()));
        }
    }
    let never: Vec<String> =
        rules::all().iter().map(|r| r.name.to_string()).filter(|n| !fired.contains(n)).collect();
    assert!(never.is_empty(), "rules no test exercises: {never:?}");
}

const CAUSAL_WHERE: &str = "(matmul (softmax (where c15 (* (matmul in2 in3) c0) c16)) in4)";

/// A causal `where(keep, scores, -inf)` becomes attention with the equivalent additive mask
/// (a new constant, so it is compared by value).
#[test]
fn attention_causal_where() {
    let start: RecExpr<FusionLang> = CAUSAL_WHERE.parse().unwrap();
    let mut egraph = FusionGraph::new(analysis());
    let root = egraph.add_expr(&start);
    let runner = Runner::default().with_egraph(egraph).with_iter_limit(30).run(&rules::all());
    let eg = &runner.egraph;
    let want = eg.analysis.constant(fusec::fusion::ConstId(11)).clone();
    let attention = eg[eg.find(root)].nodes.iter().find_map(|n| match n {
        FusionLang::Attention([_, _, _, mask, scale]) => {
            Some((eg[*mask].data.constant.clone(), eg[*scale].data.constant.clone()))
        }
        _ => None,
    });
    let (mask, scale) = attention.expect("an attention node in the root class");
    assert_eq!(mask.expect("a constant mask").to_f64_vec(), want.to_f64_vec());
    assert_eq!(scale.expect("a constant scale").to_f64_vec(), vec![0.5]);
}

/// The decomposed LayerNorm becomes one node and extraction would pick it: it is the only
/// LayerNorm-shaped class member that has an IR op.
#[test]
fn layer_norm_fixture_expression_is_one_node() {
    assert!(proves(LN_DIV, "(layer_norm in0 c9 c10 c3)"));
}

#[test]
fn rule_names_are_unique_and_kebab_case() {
    let names: Vec<String> = rules::all().iter().map(|r| r.name.to_string()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "duplicate rule names");
    for name in &names {
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
    }
}
