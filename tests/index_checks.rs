//! Indices outside their table. Every generated gather reads its index through
//! `fusec::checked_index`; the bundle lists what each reported code stands for, and a session
//! fails the run that read such an index with the node, its indices and the table named (no
//! read leaves the table, and the session runs on afterwards).

mod common;

use common::decoders::{compiled, one_token_inputs, step_matches_tract};
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::runtime::RuntimeError;

const FILE: &str = "gpt2_cache_ts.onnx";
const WPE: &str = "/model/transformer/wpe/Gather";

/// The bundle's table names both of GPT-2's gathers, with their indices and table sizes, and
/// every gather kernel reads through the check (also after a save and load).
#[test]
fn gathers_read_their_indices_through_the_check() {
    let bundle = compiled(FILE, 1, 1, 16, DType::F16, true);
    let checks: Vec<&String> = bundle.header.index_checks.values().collect();
    let named = |node: &str, indices: &str, rows: &str| {
        checks.iter().any(|m| m.contains(node) && m.contains(&format!("'{indices}'")) && m.contains(rows))
    };
    assert!(named(WPE, "position_ids", "(64 entries: -64 to 63)"), "{checks:?}");
    assert!(named("/model/transformer/wte/Gather", "input_ids", "(512 entries"), "{checks:?}");
    let sources: Vec<_> = bundle.header.steps.iter().flat_map(Step::sources).collect();
    let gathers: Vec<_> = sources.iter().filter(|s| s.source.contains("fusec::checked_index(")).collect();
    assert!(!gathers.is_empty(), "no kernel reads an index through the check");
    for code in bundle.header.index_checks.keys() {
        assert!(
            gathers.iter().any(|s| s.source.contains(&format!(", {code}u);"))),
            "no kernel reports code {code}"
        );
    }
    let path = std::env::temp_dir().join(format!("fusec-index-checks-{}.bundle", std::process::id()));
    bundle.save(&path).unwrap();
    let loaded = fusec::Bundle::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(loaded.header.index_checks, bundle.header.index_checks);
}

/// On the GPU: a position past GPT-2's 64-row table fails the run naming the table's gather;
/// the same session then runs a valid step, which matches tract.
#[test]
fn a_position_past_the_table_fails_the_run_and_the_session_runs_on() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the kernels' index checks run on a GPU machine)");
        return;
    }
    let past = 16;
    let bundle = compiled(FILE, 1, 1, past, DType::F32, true);
    let mask = vec![1i64; past + 1];
    let mut session = fusec::Session::new(&bundle, 0).unwrap();
    for (position, what) in [(64.0, "one past the table"), (500.0, "far past it"), (-65.0, "before it")] {
        let inputs = one_token_inputs(FILE, 1, past, &mask, position, 7);
        match session.run(&inputs) {
            Err(RuntimeError::IndexOutOfRange(message)) => {
                println!("position {position} ({what}): {message}");
                assert!(message.contains(WPE) && message.contains("position_ids"), "{message}");
            }
            other => panic!("position {position} ({what}): {:?}", other.map(|o| o.len())),
        }
    }
    // The report is cleared: a valid step on the same session runs and is right.
    let inputs = one_token_inputs(FILE, 1, past, &mask, past as f64, 7);
    let ours = session.run(&inputs).unwrap();
    let values: Vec<_> = inputs.iter().map(|(_, t)| t.clone()).collect();
    let theirs = fusec::import::run_tract(&common::model_path(FILE), &values).unwrap();
    for ((name, ours), theirs) in ours.iter().zip(&theirs) {
        let error = fusec::ir::rel_l2(&ours.cast(DType::F32), theirs);
        println!("after the failures: {name} rel-L2 {error:.2e}");
        assert!(error <= 1e-5, "output '{name}' rel-L2 {error:.2e}");
    }
    // A negative position counts from the table's end, as ONNX's Gather does.
    let last = one_token_inputs(FILE, 1, past, &mask, -1.0, 7);
    step_matches_tract(
        &bundle,
        FILE,
        &last,
        &last.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>(),
        1e-5,
        "position -1",
    );
}
