//! The `fusec` binary on decoders with a key/value cache, run as a user runs it: the mask's
//! length as the sum of the cache's and the new tokens', and `generate`'s command line.

mod common;

use common::cli::{fusec, text};

/// `--dim total=past+seq`: a decoder's mask length as the sum of its parts; a range of cache
/// lengths is refused with what to compile instead.
#[test]
fn a_dim_can_be_the_sum_of_two() {
    let model = common::model_path("gpt2_cache_ts.onnx");
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("step.bundle");
    let step = |past: &str| -> Vec<String> {
        let m = model.to_str().unwrap();
        let b = bundle.to_str().unwrap();
        [
            "compile",
            m,
            "-o",
            b,
            "--dim",
            "batch=1",
            "--dim",
            "seq=1",
            "--dim",
            past,
            "--dim",
            "total=past+seq",
        ]
        .map(str::to_string)
        .to_vec()
    };
    let args = step("past=7");
    let out = fusec(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let loaded = fusec::Bundle::load(&bundle).unwrap();
    let shape = |name: &str| loaded.header.inputs.iter().find(|i| i.name == name).unwrap().shape.clone();
    assert_eq!((shape("attention_mask"), shape("past_key_values.0.key")), (vec![1, 8], vec![1, 4, 7, 16]));
    // A range of cache lengths: the sum a range of its own, shown with its parts.
    let args = step("past=0..7");
    let out = fusec(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("total=past+1 (1..8)"), "{}", text(&out.stdout));
    let loaded = fusec::Bundle::load(&bundle).unwrap();
    let sum = &loaded.header.ranges[1];
    assert_eq!((sum.symbol.as_str(), sum.sum.clone(), sum.offset), ("total", vec!["past".to_string()], 1));
    // A part not given, and a size of 0 for a dim that is not a cache's length: errors.
    let args = ["inspect", model.to_str().unwrap(), "--dim", "seq=1", "--dim", "total=past+seq"];
    let out = fusec(&args);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("give past a size"), "{}", text(&out.stderr));
    let out = fusec(&["inspect", model.to_str().unwrap(), "--dim", "batch=0..4"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("at least 1"), "{}", text(&out.stderr));
}

/// A decoder's mask length not given beside its cache's and the new tokens' (`--dim past=..
/// --dim seq=..`) is inferred as their sum, said on standard error: the same bundle as with
/// `--dim total=past+seq`, for one cache length and for a range. Without `seq` it is not
/// inferred, and the error names the sum to state.
#[test]
fn a_decoders_mask_length_is_inferred_as_the_sum() {
    let model = common::model_path("gpt2_cache_ts.onnx");
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("step.bundle");
    let (m, b) = (model.to_str().unwrap(), bundle.to_str().unwrap());
    let out = fusec(&["compile", m, "-o", b, "--dim", "batch=1", "--dim", "seq=1", "--dim", "past=7"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("note: --dim total=past+seq"), "{}", text(&out.stderr));
    let loaded = fusec::Bundle::load(&bundle).unwrap();
    let shape = |name: &str| loaded.header.inputs.iter().find(|i| i.name == name).unwrap().shape.clone();
    assert_eq!((shape("attention_mask"), shape("past_key_values.0.key")), (vec![1, 8], vec![1, 4, 7, 16]));
    let out = fusec(&["compile", m, "-o", b, "--dim", "batch=1", "--dim", "seq=1", "--dim", "past=0..7"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("total=past+1 (1..8)"), "{}", text(&out.stdout));
    let loaded = fusec::Bundle::load(&bundle).unwrap();
    let sum = &loaded.header.ranges[1];
    assert_eq!((sum.symbol.as_str(), sum.sum.clone(), sum.offset), ("total", vec!["past".to_string()], 1));
    // Stated, nothing is said; without the new tokens' length, nothing is inferred.
    let out =
        fusec(&["inspect", m, "--dim", "batch=1", "--dim", "seq=1", "--dim", "past=3", "--dim", "total=4"]);
    assert!(out.status.success() && !text(&out.stderr).contains("note:"), "{}", text(&out.stderr));
    let out = fusec(&["inspect", m, "--dim", "batch=1", "--dim", "past=3"]);
    assert!(!out.status.success());
    assert!(!text(&out.stderr).contains("note:"), "{}", text(&out.stderr));
}

/// `generate --prompt` needs a tokenizer; a tokenizer that cannot be read is named.
#[test]
fn generate_text_prompts_need_a_readable_tokenizer() {
    let model = common::model_path("gpt2_cache_ts.onnx");
    let model = model.to_str().unwrap();
    let out = fusec(&["generate", model, "--prompt", "the cat"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--tokenizer"), "{}", text(&out.stderr));
    let out = fusec(&["generate", model, "--prompt", "the cat", "--tokenizer", "missing/tokenizer.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing/tokenizer.json"), "{}", text(&out.stderr));
    let out = fusec(&["generate", model]);
    assert_eq!(out.status.code(), Some(2), "a prompt is required: {}", text(&out.stderr));
}
