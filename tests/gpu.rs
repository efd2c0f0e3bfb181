//! End to end on the GPU: every fixture, fused and unfused, at several shapes, compiled,
//! run, and compared with tract on the CPU. Skips (with a printed reason) where there is no
//! CUDA driver. Set FUSEC_GPU_RESULTS=FILE to get the per-run table.

mod common;

use std::fmt::Write;

use fusec::import::run_tract;
use fusec::ir::{max_abs_diff, rel_l2, Tensor};
use fusec::runtime::{RuntimeError, Session};
use fusec::{Bundle, CompileOptions};

const FP32_TOLERANCE: f64 = 1e-5;

fn gpu() -> bool {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver on this machine");
        return false;
    }
    true
}

fn values(inputs: &[(String, Tensor)]) -> Vec<Tensor> {
    inputs.iter().map(|(_, t)| t.clone()).collect()
}

#[test]
fn every_fixture_matches_tract_on_the_gpu() {
    if !gpu() {
        return;
    }
    let mut table = String::from(
        "| model | shapes | mode | launches | max rel-L2 | result |\n|---|---|---|---|---|---|\n",
    );
    let (mut passed, mut failed) = (0, Vec::new());
    for file in common::all_fixtures() {
        let path = common::model_path(&file);
        for (variant, import) in common::shape_variants(&file).into_iter().enumerate() {
            for no_fuse in [false, true] {
                let mode = if no_fuse { "unfused" } else { "fused" };
                let options = CompileOptions {
                    import: import.clone(),
                    no_fuse,
                    arch: Some("sm_90".into()),
                    emit_cuda: None,
                };
                let outcome = (|| -> Result<(usize, f64, String), String> {
                    let bundle = fusec::compile(&path, &options).map_err(|e| e.to_string())?;
                    let mut session = Session::new(&bundle, 0).map_err(|e| e.to_string())?;
                    let model = fusec::import::import(&path, &import).map_err(|e| e.to_string())?;
                    let inputs = common::random_inputs(&model, 100 + variant as u64);
                    let ours = session.run(&inputs).map_err(|e| e.to_string())?;
                    let theirs = run_tract(&path, &values(&inputs))?;
                    let mut worst = 0.0f64;
                    for ((_, a), b) in ours.iter().zip(&theirs) {
                        let e = rel_l2(a, b);
                        worst = if e.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(e) };
                    }
                    let shapes: Vec<String> =
                        inputs.iter().map(|(_, t)| format!("{:?}", t.shape())).collect();
                    Ok((bundle.header.launches, worst, shapes.join(" ")))
                })();
                match outcome {
                    Ok((launches, worst, shapes)) => {
                        let ok = worst <= FP32_TOLERANCE;
                        let _ = writeln!(
                            table,
                            "| {file} | {shapes} | {mode} | {launches} | {worst:.2e} | {} |",
                            if ok { "pass" } else { "FAIL" }
                        );
                        if ok {
                            passed += 1;
                        } else {
                            failed.push(format!("{file} #{variant} {mode}: rel-L2 {worst:e}"));
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(table, "| {file} | #{variant} | {mode} | - | - | ERROR |");
                        failed.push(format!("{file} #{variant} {mode}: {e}"));
                    }
                }
            }
        }
    }
    let _ = writeln!(table, "\n{passed} passed, {} failed", failed.len());
    println!("{table}");
    if let Ok(path) = std::env::var("FUSEC_GPU_RESULTS") {
        std::fs::write(path, &table).unwrap();
    }
    assert!(failed.is_empty(), "{} runs failed:\n{}", failed.len(), failed.join("\n"));
}

#[test]
fn bundle_round_trip_runs_the_same() {
    if !gpu() {
        return;
    }
    let file = "gpt2_ts.onnx";
    let import = common::shape_variants(file).remove(2);
    let options = CompileOptions { import: import.clone(), arch: Some("sm_90".into()), ..Default::default() };
    let bundle = fusec::compile(&common::model_path(file), &options).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt2.bundle");
    bundle.save(&path).unwrap();
    let loaded = Bundle::load(&path).unwrap();
    let model = fusec::import::import(&common::model_path(file), &import).unwrap();
    let inputs = common::random_inputs(&model, 7);
    let direct = Session::new(&bundle, 0).unwrap().run(&inputs).unwrap();
    let reloaded = Session::new(&loaded, 0).unwrap().run(&inputs).unwrap();
    assert_eq!(direct, reloaded);
    // A bundle without PTX is compiled from its sources at load.
    let mut sources_only = loaded.clone();
    sources_only.header.ptx.clear();
    sources_only.header.arch = None;
    let compiled_at_load = Session::new(&sources_only, 0).unwrap().run(&inputs).unwrap();
    assert_eq!(direct, compiled_at_load);
    let reference = run_tract(&common::model_path(file), &values(&inputs)).unwrap();
    assert!(
        rel_l2(&direct[0].1, &reference[0]) <= FP32_TOLERANCE,
        "max abs {}",
        max_abs_diff(&direct[0].1, &reference[0])
    );
}

#[test]
fn bad_inputs_are_errors() {
    if !gpu() {
        return;
    }
    let file = "mlp_block.onnx";
    let import = common::shape_variants(file).remove(0);
    let bundle = fusec::compile(
        &common::model_path(file),
        &CompileOptions { import: import.clone(), ..Default::default() },
    )
    .unwrap();
    let mut session = Session::new(&bundle, 0).unwrap();
    let model = fusec::import::import(&common::model_path(file), &import).unwrap();
    let good = common::random_inputs(&model, 3);
    let check = |result: Result<Vec<(String, Tensor)>, RuntimeError>, needle: &str| {
        let err = result.expect_err("must fail").to_string();
        assert!(err.contains(needle), "'{needle}' not in: {err}");
    };
    check(session.run(&[]), "was not given");
    let mut extra = good.clone();
    extra.push(("z".into(), good[0].1.clone()));
    check(session.run(&extra), "'z' is not an input");
    let wrong_shape = vec![(good[0].0.clone(), good[0].1.reshaped(&[good[0].1.len()]).unwrap())];
    check(session.run(&wrong_shape), "the model takes f32");
    let wrong_type = vec![(good[0].0.clone(), good[0].1.cast(fusec::ir::DType::I64))];
    check(session.run(&wrong_type), "is i64");
    assert!(session.run(&good).is_ok());
}
