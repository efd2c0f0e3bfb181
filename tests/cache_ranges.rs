//! A decoder's step compiled for a range of cache lengths (`--dim past=1..300 --dim
//! total=past+seq`): `total` is a dim of its own whose size is always `past + seq`, so one
//! program (one bundle) serves every step of a loop that feeds the cache back as it grows.

mod common;

use std::collections::HashMap;

use fusec::import::{DimSpec, ImportOptions};
use fusec::ir::DType;
use fusec::CompileOptions;

const DECODERS: [&str; 4] =
    ["gpt2_cache_ts.onnx", "llama_cache_ts.onnx", "gpt2_cache_dynamo.onnx", "llama_cache_dynamo.onnx"];

/// Options for `dims` (`--dim` specs, sums resolved) in `precision`.
fn options(dims: &[&str], precision: DType) -> CompileOptions {
    let dims: Vec<DimSpec> = dims.iter().map(|d| d.parse().unwrap()).collect();
    let dims = fusec::import::resolve_sums(dims).unwrap();
    CompileOptions { import: ImportOptions::new(vec![], dims), precision, ..Default::default() }
}

/// `batch` and `past` given ranges, one token a step, `total` their sum.
fn range_options(batch: &str, past: &str, precision: DType) -> CompileOptions {
    options(&[&format!("batch={batch}"), "seq=1", &format!("past={past}"), "total=past+seq"], precision)
}

/// The inputs of a decoder at `batch` sequences of one token after `past` cached positions.
fn inputs_at(batch: usize, past: usize) -> ImportOptions {
    options(&[&format!("batch={batch}"), "seq=1", &format!("past={past}"), "total=past+seq"], DType::F32)
        .import
}

/// The program for the ranges has the cache's length as a dim (`past`) and the mask's and
/// the present's as another (`total`, their sum), and evaluated on the CPU at cache lengths
/// of 0 (nothing cached), 1, 17, 300 and 150 (with batches of 1 to 4) it agrees with tract on
/// the ONNX file.
#[test]
fn a_step_for_a_range_of_cache_lengths_matches_tract_at_each() {
    for file in DECODERS {
        let path = common::model_path(file);
        for precision in [DType::F32, DType::F16] {
            let options = range_options("1..4", "0..300", precision);
            let plan = fusec::pipeline::plan_range(&path, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
            let symbolic = plan.symbolic.as_ref().unwrap();
            let names: Vec<&str> = symbolic.symbols.iter().map(|r| r.symbol.as_str()).collect();
            assert_eq!(names, ["batch", "past", "total"], "{file}");
            assert!(symbolic.symbols[2].is_sum() && !symbolic.symbols[1].is_sum());
            let shape = |name: &str| {
                let b = plan.inputs.iter().chain(&plan.outputs).find(|b| b.name == name).unwrap();
                symbolic.display(b.value)
            };
            assert_eq!(shape("attention_mask"), "[batch, total]", "{file}");
            assert!(shape("past_key_values.0.key").contains(", past, "), "{file}");
            assert!(shape("present.1.value").contains(", total, "), "{file}");
            let tolerance = if precision == DType::F32 { 1e-5 } else { 1e-2 };
            for (k, &(batch, past)) in [(2, 0), (1, 1), (2, 17), (4, 300), (3, 150)].iter().enumerate() {
                let values = [batch, past, past + 1];
                let graph = plan
                    .instantiate(symbolic, &values)
                    .unwrap_or_else(|e| panic!("{file} at {batch}, {past}: {e}"));
                let model = fusec::import::import(&path, &inputs_at(batch, past)).unwrap();
                let inputs = common::random_inputs(&model, 40 + k as u64);
                let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
                let ours = fusec::ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{file}: {e}"));
                let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
                let theirs = fusec::import::run_tract(&path, &values).unwrap();
                assert_eq!(ours.len(), theirs.len());
                for ((name, a), t) in ours.iter().zip(&theirs) {
                    assert_eq!(a.shape(), t.shape(), "{file} {precision} at {batch}, {past}: {name}");
                    let err = fusec::ir::rel_l2(a, t);
                    assert!(err <= tolerance, "{file} {precision} at {batch}, {past}: {name} rel-L2 {err:e}");
                }
            }
        }
    }
}

/// The bundle for the ranges reads `batch` and `past` from its inputs and takes `total` as
/// their sum: a mask of another length is an error naming it, and `Session::select`-style
/// points are completed with the sum.
#[test]
fn a_bundle_for_cache_lengths_takes_the_sum_from_its_parts() {
    let file = DECODERS[0];
    let bundle = fusec::compile(&common::model_path(file), &range_options("1..4", "1..300", DType::F32))
        .unwrap_or_else(|e| panic!("{e}"));
    let h = &bundle.header;
    let text: Vec<String> = h.ranges.iter().map(|r| r.to_string()).collect();
    assert_eq!(text, ["batch=1..4", "past=1..300", "total=past+1 (2..301)"]);
    // Written and read back, the sum is kept.
    let dir = std::env::temp_dir().join(format!("fusec-cache-ranges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("step.bundle");
    bundle.save(&path).unwrap();
    let loaded = fusec::Bundle::load(&path).unwrap();
    assert_eq!(loaded.header.ranges, h.ranges);
    let model = fusec::import::import(&common::model_path(file), &inputs_at(3, 17)).unwrap();
    let mut inputs = common::random_inputs(&model, 5);
    let point = fusec::bundle::input_point(&h.inputs, &h.ranges, &inputs).unwrap();
    assert_eq!(point, [3, 17, 18]);
    // A mask one column short of past + 1.
    let mask = inputs.iter_mut().find(|(n, _)| n == "attention_mask").unwrap();
    let short = common::random_inputs(
        &fusec::import::import(&common::model_path(file), &inputs_at(3, 16)).unwrap(),
        5,
    );
    mask.1 = short.into_iter().find(|(n, _)| n == "attention_mask").unwrap().1;
    let err = fusec::bundle::input_point(&h.inputs, &h.ranges, &inputs).unwrap_err();
    assert!(err.contains("attention_mask") && err.contains("[3, 17]"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A prompt step with nothing cached (`past=0`: the cache inputs empty) for a range of prompt
/// lengths: one program, `total` the prompt's length, agreeing with tract at 1, 5 and 16
/// tokens.
#[test]
fn a_prompt_step_with_nothing_cached_serves_a_range_of_prompt_lengths() {
    for file in DECODERS {
        let path = common::model_path(file);
        let prompt = options(&["batch=2", "seq=1..16", "past=0", "total=past+seq"], DType::F32);
        let plan = fusec::pipeline::plan_range(&path, &prompt).unwrap_or_else(|e| panic!("{file}: {e}"));
        let symbolic = plan.symbolic.as_ref().unwrap();
        for (k, seq) in [1usize, 5, 16].into_iter().enumerate() {
            let values = [seq, seq];
            let graph =
                plan.instantiate(symbolic, &values).unwrap_or_else(|e| panic!("{file} at {seq}: {e}"));
            let at = options(&["batch=2", &format!("seq={seq}"), "past=0", "total=past+seq"], DType::F32);
            let model = fusec::import::import(&path, &at.import).unwrap();
            let inputs = common::random_inputs(&model, 60 + k as u64);
            let feeds: HashMap<_, _> = inputs.iter().cloned().collect();
            let ours = fusec::ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{file} at {seq}: {e}"));
            let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
            let theirs = fusec::import::run_tract(&path, &values).unwrap();
            for ((name, a), t) in ours.iter().zip(&theirs) {
                assert_eq!(a.shape(), t.shape(), "{file} at {seq}: {name}");
                let err = fusec::ir::rel_l2(a, t);
                assert!(err <= 1e-5, "{file} at {seq}: {name} rel-L2 {err:e}");
            }
        }
    }
}

/// A prompt step of a range of lengths after a range of cache lengths is refused with the
/// constant that cannot serve it named (the causal mask, folded from the shapes, depends on
/// where the prompt starts), not compiled wrong.
#[test]
fn a_range_of_prompt_lengths_after_a_range_of_cache_lengths_is_an_error_naming_the_mask() {
    let options = options(&["batch=2", "seq=1..16", "past=1..300", "total=past+seq"], DType::F32);
    let Err(err) = fusec::pipeline::plan_range(&common::model_path(DECODERS[0]), &options) else {
        panic!("a range of prompt lengths after a range of cache lengths was planned");
    };
    let err = err.to_string();
    assert!(err.contains("constant") && err.contains("one stored constant cannot serve the range"), "{err}");
}

/// A decoder compiled without its mask's length is an error that names the sum to state, for
/// both exporters' files (their cache and sequence dims named alike); a model without a cache
/// gets no such hint.
#[test]
fn a_missing_mask_length_is_an_error_naming_the_sum() {
    for file in DECODERS {
        let options = options(&["batch=1..4", "seq=1", "past=0..300"], DType::F32);
        let Err(err) = fusec::compile(&common::model_path(file), &options) else { panic!("{file} compiled") };
        let err = err.to_string();
        assert!(err.contains("'total'") && err.contains("--dim total=past+seq"), "{file}: {err}");
    }
    let Err(err) = fusec::compile(&common::model_path("bert_ts.onnx"), &options(&["batch=1"], DType::F32))
    else {
        panic!("bert_ts.onnx compiled without its sequence length");
    };
    assert!(err.to_string().contains("'seq'") && !err.to_string().contains("decoder"), "{err}");
}

/// A cache updated in place holds one capacity: asked for with ranges, the compile says so;
/// and a generator given a bundle for ranges says what it runs instead.
#[test]
fn ranges_with_the_cache_in_place_or_in_a_generator_are_errors_that_say_why() {
    let path = common::model_path(DECODERS[0]);
    let mut options = range_options("1..4", "1..300", DType::F32);
    options.cache_in_place = true;
    let Err(err) = fusec::compile(&path, &options) else { panic!("compiled in place for ranges") };
    let err = err.to_string();
    assert!(err.contains("--cache-in-place") && err.contains("past=1..300"), "{err}");
    let bundle = fusec::compile(&path, &range_options("1..4", "1..300", DType::F32)).unwrap();
    let err = fusec::generate::CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs).unwrap_err();
    assert!(err.contains("ranges") && err.contains("--dim past=P"), "{err}");
}

/// Whether a GPU can run the tests below (they print why they skip where not).
fn gpu() -> bool {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver on this machine");
        return false;
    }
    true
}

/// A bundle compiled from `dims` (sums resolved).
fn bundle(file: &str, dims: &[&str], precision: DType) -> fusec::Bundle {
    fusec::compile(&common::model_path(file), &options(dims, precision))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// One bundle for batches 1..4 and caches of 0..300 positions runs on the GPU at points in
/// and out of order (nothing cached included) and matches tract at each; so does one for a
/// batch of 1 (whose products may run as the kernels for a few rows).
#[test]
fn a_bundle_for_cache_lengths_runs_every_step_on_the_gpu() {
    if !gpu() {
        return;
    }
    for file in DECODERS {
        let path = common::model_path(file);
        for (precision, batches) in
            [(DType::F32, "1..4"), (DType::F16, "1..4"), (DType::F16, "1"), (DType::F32, "1")]
        {
            let tolerance = if precision == DType::F32 { 1e-5 } else { 1e-2 };
            let batch_dim = format!("batch={batches}");
            let step = bundle(file, &[&batch_dim, "seq=1", "past=0..300", "total=past+seq"], precision);
            let mut session = fusec::Session::new(&step, 0).unwrap();
            let points: &[(usize, usize)] = if batches == "1" {
                &[(1, 17), (1, 0), (1, 300), (1, 150), (1, 17), (1, 1)]
            } else {
                &[(2, 17), (1, 0), (4, 300), (3, 150), (2, 17), (1, 1)]
            };
            for (k, &(batch, past)) in points.iter().enumerate() {
                let model = fusec::import::import(&path, &inputs_at(batch, past)).unwrap();
                let inputs = common::random_inputs(&model, 70 + k as u64);
                let ours = session.run(&inputs).unwrap_or_else(|e| panic!("{file} at {batch}, {past}: {e}"));
                let expected: Vec<usize> =
                    if batches == "1" { vec![past, past + 1] } else { vec![batch, past, past + 1] };
                assert_eq!(session.point(), expected.as_slice(), "{file}");
                let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
                let theirs = fusec::import::run_tract(&path, &values).unwrap();
                for ((name, a), t) in ours.iter().zip(&theirs) {
                    assert_eq!(a.shape(), t.shape(), "{file} {precision} at {batch}, {past}: {name}");
                    let err = fusec::ir::rel_l2(a, t);
                    println!(
                        "{file} {precision} batch {batches} at {batch}, past {past}: {name} rel-L2 {err:.2e}"
                    );
                    assert!(err <= tolerance, "{file} {precision} at {batch}, {past}: {name} rel-L2 {err:e}");
                }
            }
        }
    }
}

/// The inputs of a step: `tokens` (a row a sequence), positions from `past` on, a mask of
/// ones over `past` + the tokens, and the cache `cache` (empty tensors where nothing is
/// cached yet).
fn step_inputs(
    file: &str,
    tokens: &[Vec<i64>],
    past: usize,
    cache: &[fusec::ir::Tensor],
) -> Vec<(String, fusec::ir::Tensor)> {
    use fusec::ir::{Tensor, TensorType};
    use ndarray::{ArrayD, IxDyn};
    let (batch, seq) = (tokens.len(), tokens[0].len());
    let ints = |shape: &[usize], v: Vec<i64>| {
        Tensor::from_i64(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap(), DType::I64)
    };
    let positions: Vec<i64> = (0..batch).flat_map(|_| (past..past + seq).map(|p| p as i64)).collect();
    let mut inputs = vec![
        ("input_ids".to_string(), ints(&[batch, seq], tokens.concat())),
        ("attention_mask".to_string(), ints(&[batch, past + seq], vec![1; batch * (past + seq)])),
        ("position_ids".to_string(), ints(&[batch, seq], positions)),
    ];
    let (heads, size) = if file.starts_with("llama") { (2, 16) } else { (4, 16) };
    for i in 0..4 {
        let name = format!("past_key_values.{}.{}", i / 2, ["key", "value"][i % 2]);
        let tensor = match cache.get(i) {
            Some(t) => t.clone(),
            None => Tensor::full(&TensorType::new(DType::F32, vec![batch, heads, 0, size]), 0.0),
        };
        inputs.push((name, tensor));
    }
    inputs
}

/// Each sequence's most likely next token from `logits` `[batch, seq, vocab]` (its last row).
fn greedy(logits: &fusec::ir::Tensor) -> Vec<i64> {
    let shape = logits.shape().to_vec();
    let (seq, vocab) = (shape[1], shape[2]);
    let all = logits.to_f64_vec();
    (0..shape[0])
        .map(|b| {
            let row = &all[(b * seq + seq - 1) * vocab..(b * seq + seq) * vocab];
            (0..vocab).fold(0, |best, v| if row[v] > row[best] { v } else { best }) as i64
        })
        .collect()
}

/// The loop an ONNX Runtime script runs, through two bundles: a prompt step with nothing
/// cached (prompts of 1..16 tokens), then one-token steps of one bundle for caches of 0..300
/// positions, each step's `present` fed back as the next `past`. Greedy tokens are those of
/// the same loop run by tract (fp32), and every step's logits within 1e-5 of tract's.
#[test]
fn a_generation_loop_outside_fusec_runs_on_two_range_bundles() {
    if !gpu() {
        return;
    }
    for file in DECODERS {
        let path = common::model_path(file);
        let prompt_step = bundle(file, &["batch=2", "seq=1..16", "past=0", "total=past+seq"], DType::F32);
        let step = bundle(file, &["batch=1..4", "seq=1", "past=0..300", "total=past+seq"], DType::F32);
        let mut prompts = fusec::Session::new(&prompt_step, 0).unwrap();
        let mut steps = fusec::Session::new(&step, 0).unwrap();
        let mut tokens: Vec<Vec<i64>> =
            vec![vec![5, 17, 301, 42, 9, 77, 3], vec![11, 480, 2, 64, 128, 6, 90]];
        let (mut ours, mut theirs): (Vec<fusec::ir::Tensor>, Vec<fusec::ir::Tensor>) =
            (Vec::new(), Vec::new());
        let mut worst = 0.0f64;
        for n in 0..12 {
            let past = if n == 0 { 0 } else { tokens[0].len() - 1 };
            let new: Vec<Vec<i64>> =
                tokens.iter().map(|t| if n == 0 { t.clone() } else { vec![*t.last().unwrap()] }).collect();
            let session = if n == 0 { &mut prompts } else { &mut steps };
            let out = session
                .run(&step_inputs(file, &new, past, &ours))
                .unwrap_or_else(|e| panic!("{file} step {n}: {e}"));
            let values: Vec<_> = step_inputs(file, &new, past, &theirs).into_iter().map(|(_, t)| t).collect();
            let reference = fusec::import::run_tract(&path, &values).unwrap();
            let err = fusec::ir::rel_l2(&out[0].1, &reference[0]);
            worst = worst.max(err);
            let (a, b) = (greedy(&out[0].1), greedy(&reference[0]));
            assert_eq!(a, b, "{file} step {n}: tokens");
            for (t, next) in tokens.iter_mut().zip(a) {
                t.push(next);
            }
            ours = out.into_iter().skip(1).map(|(_, t)| t).collect();
            theirs = reference.into_iter().skip(1).collect();
        }
        println!("{file}: 12 steps (prompt of 7, then caches of 7..17), the same tokens as tract, logits rel-L2 at most {worst:.2e}");
        assert!(worst <= 1e-5, "{file}: logits rel-L2 {worst:e}");
    }
}

/// In a step for a range of cache lengths at one batch size, the products (of the same sizes
/// at every cache length) keep fusec's kernels for a few rows, with the norms before them
/// taken in; with a range of batches their rows vary and they have none.
#[test]
fn products_of_static_sizes_in_a_range_bundle_keep_the_kernels_for_a_few_rows() {
    let file = DECODERS[0];
    let count = |b: &fusec::Bundle| {
        let gemms = b.header.steps.iter().filter(|s| matches!(s, fusec::codegen::Step::Gemm { .. }));
        let skinny =
            gemms.clone().filter(|s| matches!(s, fusec::codegen::Step::Gemm { skinny: Some(_), .. }));
        let norms =
            gemms.clone().filter(|s| matches!(s, fusec::codegen::Step::Gemm { absorbs: Some(_), .. }));
        (gemms.count(), skinny.count(), norms.count())
    };
    let one = bundle(file, &["batch=1", "seq=1", "past=0..300", "total=past+seq"], DType::F16);
    let (gemms, skinny, norms) = count(&one);
    assert!(
        gemms >= 8 && skinny == gemms && norms >= 4,
        "{gemms} GEMMs, {skinny} for a few rows, {norms} norms in"
    );
    let ranged = bundle(file, &["batch=1..4", "seq=1", "past=0..300", "total=past+seq"], DType::F16);
    assert_eq!(count(&ranged).1, 0);
}
