//! Indices outside their table. Every generated gather reads its index through
//! `fusec::checked_index`; the bundle lists what each reported code stands for, and a session
//! fails the run that read such an index with the node, its indices and the table named (no
//! read leaves the table, and the session runs on afterwards).

mod common;

use std::path::{Path, PathBuf};

use common::decoders::{compiled, one_token_inputs, session_matches_tract, step_matches_tract};
use common::onnx::{int, node, weight, write_model};
use fusec::codegen::Step;
use fusec::ir::{DType, Tensor, TensorType};
use fusec::pipeline::CompileOptions;
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
                let read = format!("it read {position}");
                assert!(
                    message.contains(WPE) && message.contains("position_ids") && message.contains(&read),
                    "{message}"
                );
            }
            other => panic!("position {position} ({what}): {:?}", other.map(|o| o.len())),
        }
    }
    // The report is cleared: a valid step on the same session runs and is right.
    let inputs = one_token_inputs(FILE, 1, past, &mask, past as f64, 7);
    let values: Vec<_> = inputs.iter().map(|(_, t)| t.clone()).collect();
    session_matches_tract(&mut session, FILE, &inputs, &values, 1e-5, "after the failures");
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

/// The three gathers of a small model each: data `[3, 4]` (an initializer), the indices the
/// f32 input `x` cast to integers. (name, `x`'s shape, the op, its attributes, `x` in range.)
type Case = (&'static str, Vec<i64>, &'static str, Vec<tract_onnx::pb::AttributeProto>, Vec<f32>);

fn cases() -> Vec<Case> {
    vec![
        ("gather_axis1", vec![2, 3], "Gather", vec![int("axis", 1)], vec![0.0, 3.0, -4.0, 1.0, 2.0, -1.0]),
        (
            "gather_elements",
            vec![2, 4],
            "GatherElements",
            vec![int("axis", 0)],
            vec![0.0, 1.0, 2.0, -1.0, 2.0, -3.0, 0.0, 1.0],
        ),
        // GatherND's in range without negative indices: tract's GatherND does not take them.
        ("gather_nd", vec![3, 2], "GatherND", vec![], vec![0.0, 3.0, 2.0, 0.0, 1.0, 1.0]),
    ]
}

fn case_model(dir: &Path, (name, shape, op, attributes, _): &Case) -> PathBuf {
    let nodes = vec![
        node("Cast", &["x"], "indices", vec![int("to", 7)]),
        node(op, &["table", "indices"], "y", attributes.clone()),
    ];
    write_model(dir, name, shape, nodes, vec![weight("table", &[3, 4], 5, -1.0, 2.0)])
}

fn x_of(shape: &[i64], values: &[f32]) -> Tensor {
    let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let mut x = fusec::ir::random_tensor(&TensorType::new(DType::F32, shape.clone()), 1, 0.0, 1.0);
    if let Tensor::F32(a) = &mut x {
        a.iter_mut().zip(values).for_each(|(v, &w)| *v = w);
    }
    x
}

/// Each gather of the small models is in the bundle's table, named with its indices.
#[test]
fn every_kind_of_gather_is_in_the_table() {
    let dir = tempfile::tempdir().unwrap();
    for case in cases() {
        let path = case_model(dir.path(), &case);
        let bundle = fusec::compile(&path, &CompileOptions::default()).unwrap();
        let checks: Vec<&String> = bundle.header.index_checks.values().collect();
        assert_eq!(checks.len(), 1, "{}: {checks:?}", case.0);
        assert!(
            checks[0].starts_with(&format!("{} node", case.2)) && checks[0].contains("'indices'"),
            "{checks:?}"
        );
    }
}

/// On the GPU: each kind of gather matches tract with its indices in range (negative ones
/// counted from the end) and fails the run, naming itself, with one out of range in either
/// direction; the session then runs in range again.
#[test]
fn every_kind_of_gather_reports_an_index_out_of_range() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the kernels' index checks run on a GPU machine)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for case in cases() {
        let (name, shape, op, _, good) = &case;
        let path = case_model(dir.path(), &case);
        let bundle =
            fusec::compile(&path, &CompileOptions { arch: Some("sm_90".into()), ..Default::default() })
                .unwrap();
        let mut session = fusec::Session::new(&bundle, 0).unwrap();
        let check = |session: &mut fusec::Session, x: &Tensor, what: &str| {
            let ours = session.run(&[("x".into(), x.clone())]).unwrap();
            let theirs = fusec::import::run_tract(&path, std::slice::from_ref(x)).unwrap();
            let error = fusec::ir::rel_l2(&ours[0].1, &theirs[0]);
            println!("{name} {what}: rel-L2 {error:.2e}");
            assert!(error <= 1e-6, "{name} {what}: rel-L2 {error:.2e}");
        };
        check(&mut session, &x_of(shape, good), "in range");
        for bad in [4.0, -5.0, 1e6] {
            let mut values = good.clone();
            // The last index: an axis of 4 for Gather at axis 1 and GatherND's second index, 3 else.
            *values.last_mut().unwrap() = bad;
            match session.run(&[("x".into(), x_of(shape, &values))]) {
                Err(RuntimeError::IndexOutOfRange(message)) => {
                    println!("{name} with {bad}: {message}");
                    let said = [format!("{op} node"), "'indices'".into(), format!("it read {bad}")];
                    assert!(said.iter().all(|s| message.contains(s.as_str())), "{message}");
                }
                other => panic!("{name} with {bad}: {:?}", other.map(|o| o.len())),
            }
        }
        check(&mut session, &x_of(shape, good), "in range after the failures");
        if *name == "gather_nd" {
            // The same indices counted from the end (rows of 3, columns of 4): the same output.
            let ours = |session: &mut fusec::Session, values: &[f32]| {
                session.run(&[("x".into(), x_of(shape, values))]).unwrap().remove(0).1
            };
            let negative = ours(&mut session, &[-3.0, -1.0, -1.0, -4.0, -2.0, -3.0]);
            assert_eq!(negative, ours(&mut session, good), "{name}: negative indices");
        }
    }
}

/// tract's reference run on an index past the table is an error (tract itself panics there),
/// so that `fusec run --check` and the tests report it rather than crash.
#[test]
fn the_reference_run_past_the_table_is_an_error() {
    let mask = vec![1i64; 17];
    let values: Vec<Tensor> =
        one_token_inputs(FILE, 1, 16, &mask, 64.0, 7).into_iter().map(|(_, t)| t).collect();
    // The panic is raised inside the reference run, which a program's hook can tell (the
    // `fusec` command's prints nothing for it); after the run the thread is outside it again.
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = inside.clone();
    let error = std::thread::spawn(move || {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if fusec::import::in_reference_run() {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
            } else {
                default_hook(info);
            }
        }));
        let error = fusec::import::run_tract(&common::model_path(FILE), &values).unwrap_err();
        let _ = std::panic::take_hook();
        assert!(!fusec::import::in_reference_run(), "still marked inside the reference run");
        error
    })
    .join()
    .unwrap();
    assert!(error.contains("failed on these inputs: it panicked"), "{error}");
    assert!(
        inside.load(std::sync::atomic::Ordering::SeqCst),
        "the panic was not seen inside the reference run"
    );
}

/// A gather along an axis with no entries (every index out of range) is refused when compiling,
/// naming the node.
#[test]
fn a_gather_from_an_empty_axis_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        node("Cast", &["x"], "indices", vec![int("to", 7)]),
        node("Gather", &["table", "indices"], "y", vec![int("axis", 0)]),
    ];
    let path =
        write_model(dir.path(), "empty_table", &[2], nodes, vec![weight("table", &[0, 4], 5, -1.0, 2.0)]);
    let error = fusec::compile(&path, &CompileOptions::default()).unwrap_err().to_string();
    assert!(error.contains("node 'Gather_y'"), "{error}");
    assert!(error.contains("has no entries"), "{error}");
}

/// The inputs that index a table directly, with the smallest such table's size: what `fusec
/// bench` draws them below (BERT's token types index a table of 2).
#[test]
fn inputs_that_index_tables_have_their_limits() {
    let options =
        CompileOptions { import: common::dims_at("bert_mask_ts.onnx", "2", "9"), ..Default::default() };
    let bundle = fusec::compile(&common::model_path("bert_mask_ts.onnx"), &options).unwrap();
    let limits = &bundle.header.index_limits;
    assert_eq!(limits.get("input_ids"), Some(&512), "{limits:?}");
    assert_eq!(limits.get("token_type_ids"), Some(&2), "{limits:?}");
    assert_eq!(limits.get("attention_mask"), None, "{limits:?}");
}

/// What the load times its choices on (`fusec::runtime::tuning_ones`): the GPT-2 fixture's token
/// ids, positions and mask hold ones (the mask's ones: every cached position live), its cache
/// zeros; an integer input indexing a table of one entry keeps zeros.
#[test]
fn a_decoders_ids_positions_and_mask_are_timed_with_ones() {
    let mut header = compiled(FILE, 2, 1, 7, DType::F32, false).header;
    let ones = |header: &fusec::bundle::Header| -> Vec<(String, bool)> {
        header.inputs.iter().map(|s| s.name.clone()).zip(fusec::runtime::tuning_ones(header)).collect()
    };
    let timed = ones(&header);
    for (name, one) in &timed {
        let expected = ["input_ids", "position_ids", "attention_mask"].contains(&name.as_str());
        assert_eq!(*one, expected, "{name}: {timed:?}");
    }
    assert!(timed.iter().any(|(n, _)| n.starts_with("past_key_values")), "{timed:?}");
    header.index_limits.insert("position_ids".into(), 1);
    assert!(ones(&header).contains(&("position_ids".into(), false)));
}
