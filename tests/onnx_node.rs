//! The ONNX backend node test cases (from the `onnx` package's own definitions) for every
//! supported op, through import and the reference evaluator. `.ci/run` writes them with
//! `scripts/onnx_node_cases.py`; set FUSEC_ONNX_NODE_CASES to use another directory.

use std::collections::BTreeMap;
use std::path::PathBuf;

mod common;

use common::{case_op, cases_dir, import_case};
use fusec::import::summarize;
use fusec::ir;
use fusec::tensor_io::{allclose, read_test_data_sets};

#[test]
fn node_cases_match_the_reference_evaluator() {
    let Some(dir) = cases_dir() else {
        println!("skipped: no node test cases (run scripts/onnx_node_cases.py .onnx-node-cases)");
        return;
    };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    let (mut passed, mut failed, mut unsupported) =
        (BTreeMap::<String, usize>::new(), Vec::new(), BTreeMap::<String, Vec<String>>::new());
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let model_path = case.join("model.onnx");
        let ops: Vec<String> =
            summarize(&model_path).unwrap().op_histogram.into_keys().filter(|o| o != "Constant").collect();
        let op = case_op(&name, &ops);
        let (rtol, atol) = fusec::tensor_io::read_tolerance(case).expect("every case has a tolerance.json");
        let sets = match read_test_data_sets(case) {
            Ok(sets) => sets,
            Err(e) => {
                unsupported.entry(op).or_default().push(format!("{name}: {e}"));
                continue;
            }
        };
        let (model, _, frozen) = match import_case(case, &sets[0].0) {
            Ok(m) => m,
            Err(e) => {
                unsupported.entry(op).or_default().push(format!("{name}: {e}"));
                continue;
            }
        };
        let names: Vec<String> =
            model.graph.inputs().iter().map(|&i| model.graph.node(i).name.clone()).collect();
        let mut ok = true;
        for (n, (inputs, expected)) in sets.into_iter().enumerate() {
            if n > 0 && !frozen.is_empty() {
                break;
            }
            let fed = inputs.into_iter().enumerate().filter(|(k, _)| !frozen.contains(k)).map(|(_, t)| t);
            let feeds = names.iter().cloned().zip(fed).collect();
            match ir::evaluate(&model.graph, &feeds) {
                Ok(outputs) => {
                    for ((out, actual), want) in outputs.iter().zip(&expected) {
                        if !allclose(actual, want, rtol, atol) {
                            ok = false;
                            failed.push(format!(
                                "{name} {out}: got {:?}, want {:?}",
                                actual.to_f64_vec().iter().take(6).collect::<Vec<_>>(),
                                want.to_f64_vec().iter().take(6).collect::<Vec<_>>()
                            ));
                        }
                    }
                }
                Err(e) => {
                    ok = false;
                    failed.push(format!("{name}: {e}"));
                }
            }
        }
        if ok {
            *passed.entry(op).or_default() += 1;
        }
    }
    let total_passed: usize = passed.values().sum();
    let total_unsupported: usize = unsupported.values().map(Vec::len).sum();
    println!(
        "node cases: {total_passed} passed, {} failed, {total_unsupported} unsupported, of {}",
        failed.len(),
        cases.len()
    );
    println!("passed per op: {passed:?}");
    for (op, reasons) in &unsupported {
        println!("unsupported {op}: {}", reasons.join(" | "));
    }
    assert!(failed.is_empty(), "{} node cases fail:\n{}", failed.len(), failed.join("\n"));
    assert!(total_passed > 300, "only {total_passed} cases passed");
}
