//! Given tokens scored one step at a time (`Generator::score`, what `generate --check` runs on
//! the CPU): each token's logit, the row's best and the gap between them, against the logits
//! of recomputing the whole sequence without a cache (tract, CPU, no GPU needed).

mod common;

use common::decoders::whole_sequence_logits;
use fusec::generate::{GenerateOptions, Generator, StepCompile};
use fusec::ir::DType;

const VOCAB: usize = 512;

fn cpu_generator(
    file: &str,
    batch: usize,
    capacity: usize,
) -> Generator<fusec::generate::reference::TractSteps> {
    let how = StepCompile { batch, capacity, precision: DType::F32, no_fuse: false, prompt: None };
    Generator::compile_on_cpu(&common::model_path(file), &how).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The logit of `token` after `prefix`, and the largest one, recomputed whole.
fn whole(file: &str, prefix: &[i64], token: i64) -> (f64, f64) {
    let logits = whole_sequence_logits(file, prefix);
    let last = &logits[(prefix.len() - 1) * VOCAB..prefix.len() * VOCAB];
    (last[token as usize], last.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// A generation's own greedy tokens score as the best at every step; a token put in place of
/// one of them does not, and the steps after it are scored on the prefix that holds it. Every
/// scored logit and best is the one of recomputing that prefix whole.
#[test]
fn scored_tokens_are_the_logits_of_their_prefix() {
    let prompts = [vec![5i64, 77, 300], vec![11, 2, 480, 9, 160]];
    for file in ["gpt2_cache_ts.onnx", "llama_cache_dynamo.onnx"] {
        let mut generator = cpu_generator(file, 2, 16);
        let options = GenerateOptions { max_new_tokens: 5, ..Default::default() };
        let generated = generator.generate(&prompts, &options, |_, _| {}).unwrap().tokens;
        let scores = generator.score(&prompts, &generated).unwrap();
        for (b, scored) in scores.iter().enumerate() {
            assert_eq!(scored.len(), 5, "{file}");
            assert!(scored.iter().all(|s| s.is_best() && s.gap() == 0.0), "{file} {b}: {scored:?}");
            assert_eq!(scored.iter().map(|s| s.token).collect::<Vec<_>>(), generated[b]);
        }
        // The second token of sequence 1 replaced by one that is not the best there.
        let mut altered = generated.clone();
        let replaced = (altered[1][1] + 7) % VOCAB as i64;
        altered[1][1] = replaced;
        let scores = generator.score(&prompts, &altered).unwrap();
        assert_eq!(scores[0], generator.score(&prompts, &generated).unwrap()[0], "{file}");
        let at = scores[1][1];
        assert!(!at.is_best() && at.gap() > 0.0, "{file}: {at:?}");
        assert_eq!((at.token, at.best.0), (replaced, generated[1][1]));
        for (b, scored) in scores.iter().enumerate() {
            for (i, s) in scored.iter().enumerate() {
                let prefix = [&prompts[b][..], &altered[b][..i]].concat();
                let (logit, best) = whole(file, &prefix, altered[b][i]);
                let close = |x: f32, y: f64| (f64::from(x) - y).abs() <= 1e-4 * (1.0 + y.abs());
                assert!(
                    close(s.logit, logit) && close(s.best.1, best),
                    "{file} {b} {i}: {s:?}, {logit} {best}"
                );
                assert!(s.rms > 0.0, "{file}");
            }
        }
    }
}

/// What scoring refuses, each named: a continuation count unlike the prompts', a token
/// outside the vocabulary, more tokens than the cache holds.
#[test]
fn scoring_refuses_what_does_not_fit() {
    let mut generator = cpu_generator("gpt2_cache_ts.onnx", 1, 4);
    let error = |r: Result<_, fusec::generate::GenerateError>| r.map(|_: Vec<_>| ()).unwrap_err().to_string();
    let prompt = vec![vec![1i64, 2]];
    assert!(error(generator.score(&prompt, &[])).contains("1 prompts and 0 continuations"));
    assert!(
        error(generator.score(&prompt, &[vec![512]])).contains("token 512 is outside the vocabulary of 512")
    );
    // Four cached positions and the step's own: six tokens take five steps, seven too many.
    assert_eq!(generator.score(&prompt, &[vec![3, 4, 5, 6]]).unwrap()[0].len(), 4);
    assert!(error(generator.score(&prompt, &[vec![3, 4, 5, 6, 7]])).contains("the bundle's cache holds 5"));
}
