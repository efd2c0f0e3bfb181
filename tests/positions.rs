//! A generation whose cache would take positions past the decoder's table of positions (GPT-2's
//! learned position embeddings, 64 rows in the fixtures) is refused before anything is
//! compiled, naming the table and how many positions fit — where a step at such a position
//! would read outside the table. Decoders whose positions are computed (rotary) have no table.

mod common;

use std::process::Command;

use fusec::generate::positions;

#[test]
fn the_fixtures_position_tables() {
    for (file, node) in
        [("gpt2_cache_ts.onnx", "/model/transformer/wpe/Gather"), ("gpt2_cache_dynamo.onnx", "")]
    {
        let (name, rows) = positions::table(&common::model_path(file)).unwrap().expect(file);
        assert_eq!(rows, 64, "{file}");
        assert!(node.is_empty() || name == node, "{file}: {name}");
    }
    for file in ["llama_cache_ts.onnx", "llama_cache_dynamo.onnx"] {
        assert_eq!(positions::table(&common::model_path(file)).unwrap(), None, "{file}");
    }
}

#[test]
fn a_generation_past_the_position_table_is_refused_naming_it() {
    let model = common::model_path("gpt2_cache_ts.onnx");
    let run = |new: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_fusec"))
            .args(["generate", model.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-new-tokens", new])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // 3 + 100 positions: the cache of 103 would reach position 103 of 64.
    let (code, err) = run("100");
    assert_eq!(code, Some(1), "{err}");
    for said in ["gpt2_cache_ts.onnx", "/model/transformer/wpe/Gather", "64 rows", "at most 63"] {
        assert!(err.contains(said), "'{said}' not in: {err}");
    }
    // 3 + 40 fit: no such error (without a GPU the run stops at the missing driver instead).
    let (_, err) = run("40");
    assert!(!err.contains("position table"), "{err}");
}
