//! The decoder fixtures with a cache (`models/*_cache_*.onnx`): their inputs at a batch, a
//! number of tokens and a cache length, compiled for generation, and a one-token step's inputs.

use fusec::import::{ImportOptions, InputSpec};
use fusec::ir::{DType, Tensor, TensorType};
use fusec::{Bundle, CompileOptions};
use ndarray::{ArrayD, IxDyn};

pub const DECODERS: [&str; 4] =
    ["gpt2_cache_ts.onnx", "llama_cache_ts.onnx", "gpt2_cache_dynamo.onnx", "llama_cache_dynamo.onnx"];

/// Heads and head size of each decoder's cache.
pub fn cache_dims(file: &str) -> (usize, usize) {
    if file.starts_with("llama") {
        (2, 16)
    } else {
        (4, 16)
    }
}

/// The inputs of `file` at `batch` sequences of `seq` tokens after `past` cached positions.
pub fn specs(file: &str, batch: usize, seq: usize, past: usize) -> Vec<InputSpec> {
    let (heads, size) = cache_dims(file);
    let mut specs = vec![
        InputSpec { name: "input_ids".into(), shape: vec![batch, seq], dtype: Some(DType::I64) },
        InputSpec { name: "attention_mask".into(), shape: vec![batch, past + seq], dtype: Some(DType::I64) },
        InputSpec { name: "position_ids".into(), shape: vec![batch, seq], dtype: Some(DType::I64) },
    ];
    for i in 0..2 {
        for kv in ["key", "value"] {
            specs.push(InputSpec {
                name: format!("past_key_values.{i}.{kv}"),
                shape: vec![batch, heads, past, size],
                dtype: Some(DType::F32),
            });
        }
    }
    specs
}

/// `file` compiled for sm_90 for `batch` sequences of `seq` tokens after a cache of `capacity`
/// (1: the one-token step; more: a prompt step), the cache updated in place where `in_place`.
pub fn compiled(
    file: &str,
    batch: usize,
    seq: usize,
    capacity: usize,
    precision: DType,
    in_place: bool,
) -> Bundle {
    let options = CompileOptions {
        import: ImportOptions::new(specs(file, batch, seq, capacity), vec![]),
        precision,
        arch: Some("sm_90".into()),
        cache_in_place: in_place,
        ..Default::default()
    };
    fusec::compile(&super::model_path(file), &options).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The inputs of a one-token step of `file` for `batch` sequences after `past` cached
/// positions: ids 17, 300 and 5 (the first three; then 18, 301, 6, and so on), `mask` (`batch × (past + 1)`
/// values), every position `position`, caches drawn at random from `seed` on.
pub fn one_token_inputs(
    file: &str,
    batch: usize,
    past: usize,
    mask: &[i64],
    position: f64,
    seed: u64,
) -> Vec<(String, Tensor)> {
    let mut seed = seed;
    specs(file, batch, 1, past)
        .into_iter()
        .map(|spec| {
            let ty = TensorType::new(spec.dtype.unwrap(), spec.shape.clone());
            seed += 1;
            let ids = |values: Vec<i64>| {
                Tensor::from_i64(ArrayD::from_shape_vec(IxDyn(&spec.shape), values).unwrap(), DType::I64)
            };
            let value = match spec.name.as_str() {
                "attention_mask" => ids(mask.to_vec()),
                "position_ids" => Tensor::full(&ty, position),
                "input_ids" => ids((0..batch).map(|b| [17, 300, 5][b % 3] + b as i64 / 3).collect()),
                _ => fusec::ir::random_tensor(&ty, seed, -1.0, 1.0),
            };
            (spec.name, value)
        })
        .collect()
}

/// A one-token step's masks for `batch` sequences after `past` cached positions: every position
/// live; then each sequence at a length of its own (empty slots between its last cached
/// position and the new one).
pub fn batch_masks(batch: usize, past: usize) -> [Vec<i64>; 2] {
    let total = past + 1;
    let live = |b: usize, t: usize| t == past || t < past - (b * 37) % past;
    [vec![1i64; batch * total], (0..batch * total).map(|i| i64::from(live(i / total, i % total))).collect()]
}

/// `bundle` (of fixture `file`) run on the GPU on `inputs`, and tract on `values` (the same
/// inputs in f32): every output within `tolerance` rel-L2, each printed with `what`.
pub fn step_matches_tract(
    bundle: &Bundle,
    file: &str,
    inputs: &[(String, Tensor)],
    values: &[Tensor],
    tolerance: f64,
    what: &str,
) {
    let mut session = fusec::Session::new(bundle, 0).unwrap();
    session_matches_tract(&mut session, file, inputs, values, tolerance, what);
}

/// [`step_matches_tract`] on a session already loaded (one that has run before).
pub fn session_matches_tract(
    session: &mut fusec::Session,
    file: &str,
    inputs: &[(String, Tensor)],
    values: &[Tensor],
    tolerance: f64,
    what: &str,
) {
    let ours = session.run(inputs).unwrap();
    let theirs = fusec::import::run_tract(&super::model_path(file), values).unwrap();
    assert_eq!(ours.len(), theirs.len(), "{what}");
    for ((name, ours), theirs) in ours.iter().zip(&theirs) {
        let error = fusec::ir::rel_l2(&ours.cast(DType::F32), theirs);
        println!("{what}: {name} rel-L2 {error:.2e}");
        assert!(error <= tolerance, "{what}: output '{name}' rel-L2 {error:.2e}");
    }
}

/// The logits tract gives for `tokens` (one sequence) recomputed whole with no cache: the
/// sequence at once after one empty, masked cache slot; `[tokens.len() × 512]`, flat.
pub fn whole_sequence_logits(file: &str, tokens: &[i64]) -> Vec<f64> {
    let (heads, size) = cache_dims(file);
    let n = tokens.len();
    let ints = |shape: &[usize], v: Vec<i64>| {
        Tensor::from_i64(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap(), DType::I64)
    };
    let mut mask = vec![1i64; n + 1];
    mask[0] = 0;
    let inputs =
        [ints(&[1, n], tokens.to_vec()), ints(&[1, n + 1], mask), ints(&[1, n], (0..n as i64).collect())];
    let cache = (0..4).map(|_| Tensor::full(&TensorType::new(DType::F32, vec![1, heads, 1, size]), 0.0));
    let values: Vec<Tensor> = inputs.into_iter().chain(cache).collect();
    let outputs =
        fusec::import::run_tract(&super::model_path(file), &values).unwrap_or_else(|e| panic!("{e}"));
    outputs[0].to_f64_vec()
}

/// The next token after each prefix of `tokens` as tract computes it with no cache
/// ([`whole_sequence_logits`]).
pub fn reference_tokens(file: &str, prompt: &[i64], count: usize) -> Vec<i64> {
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..count {
        let n = tokens.len();
        let logits = whole_sequence_logits(file, &tokens);
        let last = &logits[(n - 1) * 512..n * 512];
        let best = (0..512).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        out.push(best as i64);
        tokens.push(best as i64);
    }
    out
}
