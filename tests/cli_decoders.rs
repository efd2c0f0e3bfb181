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

/// The tokens `generate` printed for each sequence (`sequence B: id,id,…`).
fn printed_tokens(stdout: &str) -> Vec<Vec<i64>> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("sequence "))
        .filter(|l| !l.contains(" text: "))
        .map(|l| {
            let ids = l.split_once(": ").map_or("", |(_, ids)| ids);
            ids.split(',').filter(|t| !t.is_empty()).map(|t| t.parse().unwrap()).collect()
        })
        .collect()
}

/// `generate --cpu`: the decoding loop with tract on the CPU, no GPU needed — for each fixture
/// and two prompts of different lengths (one as a prompt step, the other token by token after
/// it), the greedy tokens of recomputing every prefix whole without a cache.
#[test]
fn generate_on_the_cpu_gives_the_tokens_of_recomputing_without_a_cache() {
    let prompts = [vec![5i64, 77, 300], vec![11, 2, 480, 9, 160]];
    for file in ["gpt2_cache_ts.onnx", "llama_cache_dynamo.onnx"] {
        let model = common::model_path(file);
        let ids: Vec<String> =
            prompts.iter().map(|p| p.iter().map(i64::to_string).collect::<Vec<_>>().join(",")).collect();
        let args =
            ["generate", model.to_str().unwrap(), "--cpu", "--max-new-tokens", "5", "--prompt-ids", &ids[0]];
        let out = fusec(&[&args[..], &["--prompt-ids", &ids[1]]].concat());
        assert!(out.status.success(), "{file}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.contains("tokens/s (2 sequences, greedy) on the CPU"), "{stdout}");
        let tokens = printed_tokens(&stdout);
        assert_eq!(tokens.len(), 2, "{stdout}");
        for (prompt, tokens) in prompts.iter().zip(&tokens) {
            assert_eq!(
                tokens,
                &common::decoders::reference_tokens(file, prompt, 5),
                "{file} after {prompt:?}"
            );
        }
    }
}

/// `generate --cpu` on a step bundle runs the ONNX file it was compiled from at the bundle's
/// batch and cache: the tokens of recomputing every prefix whole. A bundle whose file is gone
/// is an error naming both.
#[test]
fn generate_on_the_cpu_takes_a_bundles_own_onnx_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("decoder.onnx");
    std::fs::copy(common::model_path("gpt2_cache_ts.onnx"), &model).unwrap();
    let bundle = dir.path().join("step.bundle");
    let (m, b) = (model.to_str().unwrap(), bundle.to_str().unwrap());
    let dims = ["--dim", "batch=1", "--dim", "seq=1", "--dim", "past=9", "--dim", "total=past+seq"];
    let out = fusec(&[&["compile", m, "-o", b][..], &dims].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = fusec(&["generate", b, "--prompt-ids", "5,77,300", "--max-new-tokens", "6", "--cpu"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tokens = printed_tokens(&text(&out.stdout));
    assert_eq!(tokens, vec![common::decoders::reference_tokens("gpt2_cache_ts.onnx", &[5, 77, 300], 6)]);
    std::fs::remove_file(&model).unwrap();
    let out = fusec(&["generate", b, "--prompt-ids", "5,77,300", "--cpu"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(b) && err.contains(m) && err.contains("not there"), "{err}");
}

/// What `--cpu` and `--check` refuse, each named: a draw for `--check` (it compares greedy
/// tokens), a half type for `--cpu`, both at once.
#[test]
fn generate_reference_flags_refuse_what_they_cannot_do() {
    let model = common::model_path("gpt2_cache_ts.onnx");
    let m = model.to_str().unwrap();
    let out = fusec(&["generate", m, "--prompt-ids", "1,2", "--check", "--sample", "top-k=3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--check compares greedy tokens"), "{}", text(&out.stderr));
    let out = fusec(&["generate", m, "--prompt-ids", "1,2", "--cpu", "--precision", "fp16"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("leave out --precision fp16"), "{}", text(&out.stderr));
    let out = fusec(&["generate", m, "--prompt-ids", "1,2", "--cpu", "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// `generate --check` on a GPU: the GPU's greedy tokens scored by tract's logits at the same
/// prefix, for an fp32 build (every token tract's best) and an fp16 one (each within a near
/// tie of it); skipped without a GPU.
#[test]
fn generate_check_compares_the_gpus_tokens_with_the_cpus() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (generate --check runs the decoder on a GPU)");
        return;
    }
    let model = common::model_path("gpt2_cache_ts.onnx");
    for precision in ["fp32", "fp16"] {
        let args =
            ["generate", model.to_str().unwrap(), "--prompt-ids", "5,77,300", "--prompt-ids", "11,2,480,9"];
        let out =
            fusec(&[&args[..], &["--max-new-tokens", "12", "--check", "--precision", precision]].concat());
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{precision}: {stdout}{}", text(&out.stderr));
        assert_eq!(stdout.matches("check sequence ").count(), 2, "{stdout}");
        if precision == "fp32" {
            assert_eq!(stdout.matches("all 12 tokens as on the CPU: pass").count(), 2, "{stdout}");
        }
    }
    // A step bundle (fp16, the cache in place): checked against its own ONNX file.
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("step.bundle");
    let (m, b) = (model.to_str().unwrap(), bundle.to_str().unwrap());
    let dims = ["--dim", "batch=1", "--dim", "seq=1", "--dim", "past=15", "--dim", "total=past+seq"];
    let out =
        fusec(&[&["compile", m, "-o", b, "--precision", "fp16", "--cache-in-place"][..], &dims].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = fusec(&["generate", b, "--prompt-ids", "5,77,300", "--max-new-tokens", "12", "--check"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(stdout.matches("check sequence 0: ").count(), 1, "{stdout}");
}
