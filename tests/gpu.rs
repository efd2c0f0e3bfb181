//! End to end on the GPU: every fixture, fused and unfused, at several shapes, compiled,
//! run, and compared with tract on the CPU. Skips (with a printed reason) where there is no
//! CUDA driver. Set FUSEC_GPU_RESULTS=FILE to get the per-run table.

mod common;
mod crash;

use std::fmt::Write;

use fusec::import::run_tract;
use fusec::ir::{max_abs_diff, rel_l2, DType, Tensor};
use fusec::runtime::{RuntimeError, Session};
use fusec::{Bundle, CompileOptions};

const FP32_TOLERANCE: f64 = 1e-5;
/// fp16/bf16 storage with fp32 accumulation, against the fp32 reference.
const HALF_TOLERANCE: f64 = 1e-2;

fn gpu() -> bool {
    crash::install();
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
        "| model | shapes | mode | kernels | max rel-L2 | result |\n|---|---|---|---|---|---|\n",
    );
    let (mut passed, mut failed) = (0, Vec::new());
    // FUSEC_GPU_FIXTURES=a.onnx,b.onnx narrows the run (to split it over device calls).
    let only: Option<Vec<String>> =
        std::env::var("FUSEC_GPU_FIXTURES").ok().map(|v| v.split(',').map(str::to_string).collect());
    for file in common::all_fixtures() {
        if only.as_ref().is_some_and(|only| !only.contains(&file)) {
            continue;
        }
        let path = common::model_path(&file);
        let variants = common::shape_variants(&file).into_iter().enumerate();
        // f32 at every shape; f16 and bf16 at the first (device time is limited), and at
        // every shape for models with attention (tensor-core kernels at odd sequence lengths).
        let attention = file.starts_with("attention")
            || ["bert_ts.onnx", "gpt2_ts.onnx", "llama_ts.onnx", "vit_ts.onnx"].contains(&file.as_str());
        let runs = variants.flat_map(move |(v, import)| {
            let precisions: &[DType] =
                if v == 0 || attention { &[DType::F32, DType::F16, DType::BF16] } else { &[DType::F32] };
            precisions.iter().flat_map(move |&p| [false, true].map(|no_fuse| (v, import.clone(), p, no_fuse)))
        });
        for (variant, import, precision, no_fuse) in runs {
            {
                let mode = format!("{} {precision}", if no_fuse { "unfused" } else { "fused" });
                let tolerance = if precision == DType::F32 { FP32_TOLERANCE } else { HALF_TOLERANCE };
                let options = CompileOptions {
                    import: import.clone(),
                    no_fuse,
                    arch: Some("sm_90".into()),
                    precision,
                    ..Default::default()
                };
                eprint!("{file} #{variant} {mode}: ");
                let started = std::time::Instant::now();
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
                    Ok((bundle.header.kernels, worst, shapes.join(" ")))
                })();
                match &outcome {
                    Ok((_, worst, _)) => eprintln!("{worst:.2e} in {:.1} s", started.elapsed().as_secs_f64()),
                    Err(e) => eprintln!("error {e}"),
                }
                match outcome {
                    Ok((launches, worst, shapes)) => {
                        let ok = worst <= tolerance;
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

/// One bundle per fixture for batch sizes 1..4 runs at every size (in and out of order, sizes
/// run again after others) and matches tract at each; a size outside the range is an error.
/// Set FUSEC_GPU_RANGE_RESULTS=FILE to get the table.
#[test]
fn one_bundle_runs_every_shape_of_its_ranges() {
    if !gpu() {
        return;
    }
    let mut table = String::from(
        "| model | precision | ranges | shapes run (batch×seq) | max rel-L2 | result |\n|---|---|---|---|---|---|\n",
    );
    let mut failed = Vec::new();
    let attention = [
        "attention_d64.onnx",
        "bert_ts.onnx",
        "gpt2_ts.onnx",
        "llama_ts.onnx",
        "vit_ts.onnx",
        "bert_mask_ts.onnx",
        "bert_mask_dynamo.onnx",
        "gpt2_mask_ts.onnx",
        "gpt2_mask_dynamo.onnx",
    ];
    for file in common::all_fixtures().into_iter().filter(|f| f != "op_coverage.onnx") {
        let path = common::model_path(&file);
        let precisions: &[DType] =
            if attention.contains(&file.as_str()) { &[DType::F32, DType::F16] } else { &[DType::F32] };
        // batch 1..4, and seq 1..64 where the model has one that a range can follow.
        let seq_range = common::seq_range(&file);
        let seq_text = if seq_range { "1..64" } else { "7" };
        let points: Vec<(usize, usize)> = if seq_range {
            vec![(3, 7), (1, 1), (4, 64), (2, 33), (3, 7), (1, 50), (4, 2)]
        } else {
            vec![(3, 7), (1, 7), (4, 7), (2, 7), (3, 7), (1, 7)]
        };
        for &precision in precisions {
            let tolerance = if precision == DType::F32 { FP32_TOLERANCE } else { HALF_TOLERANCE };
            let options = CompileOptions {
                import: common::dims_at(&file, "1..4", seq_text),
                arch: Some("sm_90".into()),
                precision,
                ..Default::default()
            };
            let outcome = (|| -> Result<f64, String> {
                let bundle = fusec::compile(&path, &options).map_err(|e| e.to_string())?;
                let mut session = Session::new(&bundle, 0).map_err(|e| e.to_string())?;
                let mut worst = 0.0f64;
                for (k, &(b, s)) in points.iter().enumerate() {
                    let import = common::dims_at(&file, &b.to_string(), &s.to_string());
                    let model = fusec::import::import(&path, &import).map_err(|e| e.to_string())?;
                    let inputs = common::random_inputs(&model, 40 + k as u64);
                    let ours = session.run(&inputs).map_err(|e| format!("{b}x{s}: {e}"))?;
                    let expected: Vec<usize> = if seq_range { vec![b, s] } else { vec![b] };
                    if session.point() != expected.as_slice() {
                        return Err(format!("{b}x{s}: the session runs at {:?}", session.point()));
                    }
                    let theirs = run_tract(&path, &values(&inputs))?;
                    for ((_, a), t) in ours.iter().zip(&theirs) {
                        if a.shape() != t.shape() {
                            return Err(format!("{b}x{s}: output {:?}, tract's {:?}", a.shape(), t.shape()));
                        }
                        let e = rel_l2(a, t);
                        worst = if e.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(e) };
                    }
                }
                // Outside the range: an error naming the input and the range.
                let model = fusec::import::import(&path, &common::dims_at(&file, "5", "7"))
                    .map_err(|e| e.to_string())?;
                let err =
                    session.run(&common::random_inputs(&model, 9)).err().ok_or("batch 5 ran")?.to_string();
                if !err.contains("must be in 1..4")
                    || !err.contains(&format!("'{}'", model.graph.node(model.graph.inputs()[0]).name))
                {
                    return Err(format!("batch 5: {err}"));
                }
                Ok(worst)
            })();
            let shapes: Vec<String> = points
                .iter()
                .map(|(b, s)| if common::has_seq(&file) { format!("{b}×{s}") } else { b.to_string() })
                .collect();
            let shapes = shapes.join(", ");
            let ranges = if seq_range {
                "batch=1..4 seq=1..64"
            } else if common::has_seq(&file) {
                "batch=1..4 (seq=7)"
            } else {
                "batch=1..4"
            };
            match outcome {
                Ok(worst) if worst <= tolerance => {
                    let _ = writeln!(
                        table,
                        "| {file} | {precision} | {ranges} | {shapes} | {worst:.2e} | pass |"
                    );
                }
                Ok(worst) => {
                    let _ = writeln!(
                        table,
                        "| {file} | {precision} | {ranges} | {shapes} | {worst:.2e} | FAIL |"
                    );
                    failed.push(format!("{file} {precision}: rel-L2 {worst:e}"));
                }
                Err(e) => {
                    let _ = writeln!(table, "| {file} | {precision} | {ranges} | - | - | ERROR |");
                    failed.push(format!("{file} {precision}: {e}"));
                }
            }
        }
    }
    println!("{table}");
    if let Ok(path) = std::env::var("FUSEC_GPU_RANGE_RESULTS") {
        std::fs::write(path, &table).unwrap();
    }
    assert!(failed.is_empty(), "{} failed:\n{}", failed.len(), failed.join("\n"));
}

/// A bundle for batch 1..256 × seq 1..64 of the tiny BERT in f16: its attention kernels have
/// variants tiled for small batches and short sequences (`KernelSource::variants`); the points
/// that take them, and the top's tiling, agree with tract.
#[test]
fn attention_variants_match_tract() {
    if !gpu() {
        return;
    }
    let file = "bert_ts.onnx";
    let path = common::model_path(file);
    let options = CompileOptions {
        import: common::dims_at(file, "1..256", "1..64"),
        arch: Some("sm_90".into()),
        precision: DType::F16,
        ..Default::default()
    };
    let bundle = fusec::compile(&path, &options).unwrap();
    let variants: usize = bundle
        .header
        .steps
        .iter()
        .map(|s| match s {
            fusec::codegen::Step::Launch(k) => k.variants.len(),
            _ => 0,
        })
        .sum();
    assert!(variants > 0, "no attention variants");
    let mut session = Session::new(&bundle, 0).unwrap();
    for (k, (b, s)) in
        [(1usize, 64usize), (3, 7), (256, 64), (200, 50), (1, 1), (17, 33)].into_iter().enumerate()
    {
        let import = common::dims_at(file, &b.to_string(), &s.to_string());
        let model = fusec::import::import(&path, &import).unwrap();
        let inputs = common::random_inputs(&model, 70 + k as u64);
        let ours = session.run(&inputs).unwrap();
        let theirs = run_tract(&path, &values(&inputs)).unwrap();
        let err = rel_l2(&ours[0].1, &theirs[0]);
        println!("{b}x{s}: rel-L2 {err:.2e}");
        assert!(err <= HALF_TOLERANCE, "{b}x{s}: rel-L2 {err:e}");
    }
}

/// `mlp_block.onnx` compiled (f32) at its first test shape, and random inputs for it.
fn mlp_block() -> (Bundle, Vec<(String, Tensor)>) {
    let (bundle, model) = common::compiled_variant("mlp_block.onnx", 0);
    (bundle, common::random_inputs(&model, 3))
}

#[test]
fn bad_inputs_are_errors() {
    if !gpu() {
        return;
    }
    let (bundle, good) = mlp_block();
    let mut session = Session::new(&bundle, 0).unwrap();
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

/// `run_into` fills the tensors it is given with what `run` returns, run after run, and names
/// the output whose tensor does not fit.
#[test]
fn run_into_reuses_its_outputs() {
    if !gpu() {
        return;
    }
    let (bundle, inputs) = mlp_block();
    let mut session = Session::new(&bundle, 0).unwrap();
    let expected = values(&session.run(&inputs).unwrap());
    // Other values to start with, so that a run that wrote nothing would show.
    let mut outputs: Vec<Tensor> = expected
        .iter()
        .map(|t| {
            fusec::ir::random_input(
                "o",
                &fusec::ir::TensorType::new(t.dtype(), t.shape().to_vec()),
                5,
                -1.0,
                1.0,
            )
        })
        .collect();
    assert_ne!(outputs, expected);
    for _ in 0..3 {
        session.run_into(&inputs, &mut outputs).unwrap();
        assert_eq!(outputs, expected);
    }
    let name = session.outputs()[0].name.clone();
    let mut wrong = vec![outputs[0].reshaped(&[outputs[0].len()]).unwrap()];
    wrong.extend(outputs[1..].iter().cloned());
    let err = session.run_into(&inputs, &mut wrong).unwrap_err().to_string();
    assert!(err.contains(&format!("output '{name}'")), "{err}");
    let err = session.run_into(&inputs, &mut []).unwrap_err().to_string();
    assert!(err.contains("0 output tensors given"), "{err}");
}

/// A launch the driver refuses (a block of 4,096 threads, over the limit of 1,024) is an error
/// naming the kernel; the process goes on, and a good bundle still runs.
#[test]
fn a_refused_launch_names_its_kernel() {
    if !gpu() {
        return;
    }
    let (good, inputs) = mlp_block();
    let mut bad = good.clone();
    let name = bad
        .header
        .steps
        .iter_mut()
        .find_map(|step| match step {
            fusec::codegen::Step::Launch(source) => {
                source.block = 4096;
                Some(source.name.clone())
            }
            _ => None,
        })
        .expect("the model has a kernel");
    // A session that times its GEMMs runs the program while it is made (unless the choices
    // are cached): the launch fails there or in the run.
    let err = Session::new(&bad, 0)
        .and_then(|mut session| session.run(&inputs))
        .expect_err("a block of 4096 threads")
        .to_string();
    assert!(err.contains(&format!("launching kernel {name}")) && err.contains("block 4096"), "{err}");
    assert!(Session::new(&good, 0).unwrap().run(&inputs).is_ok());
}

/// After the first run the plan replays as one CUDA graph, with the same results as running
/// the steps one by one; the device-pointer interface sees the same data.
#[test]
fn cuda_graph_replay_matches_step_by_step() {
    if !gpu() {
        return;
    }
    let (bundle, model) = common::compiled_variant("bert_ts.onnx", 2);
    let mut graphed = Session::new(&bundle, 0).unwrap();
    let mut eager = Session::with_options(
        &bundle,
        0,
        fusec::runtime::SessionOptions { cuda_graph: false, ..Default::default() },
    )
    .unwrap();
    // Programmatic dependent launch: timed both ways at load where it can be used (sm_90 and
    // later, `FUSEC_PDL` unset), never without a graph; forced on, the same outputs.
    let mut programmatic = Session::with_options(
        &bundle,
        0,
        fusec::runtime::SessionOptions { programmatic_launch: true, ..Default::default() },
    )
    .unwrap();
    let hopper = graphed.arch.trim_start_matches("sm_").parse::<u32>().is_ok_and(|a| a >= 90);
    if hopper && std::env::var_os("FUSEC_PDL").is_none() {
        let choice = graphed.launch_choice.expect("the launch timed both ways at load");
        assert!(choice.plain_ms > 0.0 && choice.programmatic_ms > 0.0, "{choice:?}");
        assert!(programmatic.launch_choice.is_none());
    }
    assert!(eager.launch_choice.is_none());
    for seed in [1, 2, 3] {
        let inputs = common::random_inputs(&model, seed);
        let a = graphed.run(&inputs).unwrap();
        assert!(graphed.replays_graph());
        let b = eager.run(&inputs).unwrap();
        assert!(!eager.replays_graph());
        assert_eq!(a, b, "seed {seed}");
        assert_eq!(programmatic.run(&inputs).unwrap(), b, "seed {seed}, programmatic launch");
        // Device buffers: write the input where the session reads it, run, read the output.
        let (ptr, bytes) = graphed.input_device_ptr(&inputs[0].0).unwrap();
        let data = fusec::plan::tensor_bytes(&inputs[0].1);
        assert_eq!(data.len(), bytes);
        // SAFETY: `ptr` is the input's buffer of `bytes` bytes in the session's arena, on this
        // thread's context.
        unsafe { cudarc::driver::result::memcpy_htod_sync(ptr, &data).unwrap() };
        graphed.execute_all().unwrap();
        let (out, out_bytes) = graphed.output_device_ptr(&a[0].0).unwrap();
        let mut host = vec![0u8; out_bytes];
        // SAFETY: as above, for the output's buffer.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, out).unwrap() };
        let t = fusec::runtime::tensor_from_bytes(&host, a[0].1.shape(), a[0].1.dtype()).unwrap();
        assert_eq!(t, a[0].1);
    }
}

/// Sessions made and run on several threads at once, from one bundle (each tuning its GEMMs
/// and capturing its CUDA graph while the others load modules and launch): every run gives
/// the single-threaded output, bit for bit.
#[test]
fn sessions_on_several_threads_agree() {
    if !gpu() {
        return;
    }
    let file = "gpt2_ts.onnx";
    let import = common::shape_variants(file).remove(2);
    let options = CompileOptions { import: import.clone(), precision: DType::F16, ..Default::default() };
    let bundle = fusec::compile(&common::model_path(file), &options).unwrap();
    let model = fusec::import::import(&common::model_path(file), &import).unwrap();
    let inputs = common::random_inputs(&model, 5);
    let reference = Session::new(&bundle, 0).unwrap().run(&inputs).unwrap();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    (0..3)
                        .map(|_| {
                            let mut session = Session::new(&bundle, 0)?;
                            (0..4).map(|_| session.run(&inputs)).collect::<Result<Vec<_>, _>>()
                        })
                        .collect::<Result<Vec<_>, RuntimeError>>()
                })
            })
            .collect();
        for thread in threads {
            let runs = thread.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
            for outputs in runs.iter().flatten() {
                assert_eq!(*outputs, reference);
            }
        }
    });
}

/// The ONNX backend node test cases (see tests/onnx_node.rs), compiled and run on the GPU.
/// Set FUSEC_GPU_NODE_RESULTS=FILE to get the pass counts per op.
#[test]
fn onnx_node_cases_on_the_gpu() {
    if !gpu() {
        return;
    }
    let Some(dir) = common::cases_dir() else {
        println!(
            "skipped: no node test cases (run scripts/onnx_node_cases.py and set FUSEC_ONNX_NODE_CASES)"
        );
        return;
    };
    let mut cases: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    let mut passed: std::collections::BTreeMap<String, usize> = Default::default();
    let mut unsupported: std::collections::BTreeMap<String, usize> = Default::default();
    let mut failed = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let ops: Vec<String> = fusec::import::summarize(&case.join("model.onnx"))
            .unwrap()
            .op_histogram
            .into_keys()
            .filter(|o| o != "Constant")
            .collect();
        let op = common::case_op(&name, &ops);
        let (rtol, atol) = fusec::tensor_io::read_tolerance(case).expect("every case has a tolerance.json");
        let Ok(sets) = fusec::tensor_io::read_test_data_sets(case) else {
            *unsupported.entry(op).or_default() += 1;
            continue;
        };
        let Ok((model, import, frozen)) = common::import_case(case, &sets[0].0) else {
            *unsupported.entry(op).or_default() += 1;
            continue;
        };
        let options = CompileOptions { import, arch: Some("sm_90".into()), ..Default::default() };
        let bundle = match fusec::compile(&case.join("model.onnx"), &options) {
            Ok(b) => b,
            Err(e) if e.to_string().contains("not supported") => {
                *unsupported.entry(op).or_default() += 1;
                continue;
            }
            Err(e) => {
                failed.push(format!("{name}: compile: {e}"));
                continue;
            }
        };
        let names: Vec<String> =
            model.graph.inputs().iter().map(|&i| model.graph.node(i).name.clone()).collect();
        let outcome = (|| -> Result<(), String> {
            let mut session = Session::new(&bundle, 0).map_err(|e| e.to_string())?;
            for (n, (inputs, expected)) in sets.into_iter().enumerate() {
                if n > 0 && !frozen.is_empty() {
                    break;
                }
                let fed = inputs.into_iter().enumerate().filter(|(k, _)| !frozen.contains(k)).map(|(_, t)| t);
                let feeds: Vec<(String, Tensor)> = names.iter().cloned().zip(fed).collect();
                let outputs = session.run(&feeds).map_err(|e| e.to_string())?;
                for ((out, actual), want) in outputs.iter().zip(&expected) {
                    if !fusec::tensor_io::allclose(actual, want, rtol, atol) {
                        return Err(format!(
                            "{out}: got {:?}, want {:?}",
                            &actual.to_f64_vec()[..actual.len().min(6)],
                            &want.to_f64_vec()[..want.len().min(6)]
                        ));
                    }
                }
            }
            Ok(())
        })();
        match outcome {
            Ok(()) => *passed.entry(op).or_default() += 1,
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    let total: usize = passed.values().sum();
    let mut table = format!(
        "{total} passed, {} failed, {} not supported (element types or layouts fusec does not handle yet), of {} cases\n\n| op | passed |\n|---|---|\n",
        failed.len(),
        unsupported.values().sum::<usize>(),
        cases.len()
    );
    for (op, n) in &passed {
        table.push_str(&format!("| {op} | {n} |\n"));
    }
    println!("{table}");
    if let Ok(path) = std::env::var("FUSEC_GPU_NODE_RESULTS") {
        std::fs::write(path, &table).unwrap();
    }
    assert!(failed.is_empty(), "{} node cases fail on the GPU:\n{}", failed.len(), failed.join("\n"));
}

/// Padding does not leak: in a right-padded batch, the positions a mask keeps give the same
/// outputs as the sequence run alone, unpadded (fused, fp32, rel-L2 ≤ 1e-5), for the
/// fixtures that take `attention_mask`, from both exporters.
#[test]
fn padded_positions_match_the_unpadded_sequence() {
    if !gpu() {
        return;
    }
    let (seq, kept) = (13usize, 8usize);
    for file in ["bert_mask_ts.onnx", "bert_mask_dynamo.onnx", "gpt2_mask_ts.onnx", "gpt2_mask_dynamo.onnx"] {
        let path = common::model_path(file);
        let run = |batch: usize, seq: usize, feeds: &dyn Fn(&str) -> Tensor| -> Tensor {
            let import = fusec::import::ImportOptions::default().dim("batch", batch).dim("seq", seq);
            let options =
                CompileOptions { import: import.clone(), arch: Some("sm_90".into()), ..Default::default() };
            let bundle = fusec::compile(&path, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
            let mut session = Session::new(&bundle, 0).unwrap_or_else(|e| panic!("{file}: {e}"));
            let inputs: Vec<(String, Tensor)> =
                session.inputs().iter().map(|spec| (spec.name.clone(), feeds(&spec.name))).collect();
            let mut outputs = session.run(&inputs).unwrap_or_else(|e| panic!("{file}: {e}"));
            outputs.remove(0).1
        };
        let ids: Vec<i64> = (0..2 * seq as i64).map(|i| 1 + (i * 37 + 11) % 500).collect();
        let types = |t: usize| i64::from(t >= 5);
        let table = |batch: usize, seq: usize, value: &dyn Fn(usize, usize) -> i64| {
            let values: Vec<i64> = (0..batch * seq).map(|i| value(i / seq, i % seq)).collect();
            let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[batch, seq]), values).unwrap();
            Tensor::from_i64(array, DType::I64)
        };
        // Row 0 whole, row 1 kept for its first `kept` tokens, then padding (id 0).
        let padded = run(2, seq, &|name| match name {
            "attention_mask" => table(2, seq, &|r, t| i64::from(r == 0 || t < kept)),
            "token_type_ids" => table(2, seq, &|_, t| types(t)),
            _ => table(2, seq, &|r, t| if r == 1 && t >= kept { 0 } else { ids[r * seq + t] }),
        });
        let alone = run(1, kept, &|name| match name {
            "attention_mask" => table(1, kept, &|_, _| 1),
            "token_type_ids" => table(1, kept, &|_, t| types(t)),
            _ => table(1, kept, &|_, t| ids[seq + t]),
        });
        let hidden = padded.shape()[2];
        let rows = padded.to_f64_vec();
        let kept_rows: Vec<f64> = rows[(seq * hidden)..(seq * hidden + kept * hidden)].to_vec();
        let a = Tensor::from_f64(
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[1, kept, hidden]), kept_rows).unwrap(),
            DType::F32,
        );
        let err = rel_l2(&a, &alone);
        println!("{file}: padded row's kept positions against the sequence alone: rel-L2 {err:.2e}");
        assert!(
            err <= FP32_TOLERANCE,
            "{file}: padding changed the kept positions' outputs (rel-L2 {err:e})"
        );
        // One bundle for batch 1..4 × seq 1..64 runs both shapes, the same.
        let options = CompileOptions {
            import: common::dims_at(file, "1..4", "1..64"),
            arch: Some("sm_90".into()),
            ..Default::default()
        };
        let bundle = fusec::compile(&path, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut session = Session::new(&bundle, 0).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut run_range = |feeds: &dyn Fn(&str) -> Tensor| -> Tensor {
            let inputs: Vec<(String, Tensor)> =
                session.inputs().iter().map(|spec| (spec.name.clone(), feeds(&spec.name))).collect();
            session.run(&inputs).unwrap_or_else(|e| panic!("{file}: {e}")).remove(0).1
        };
        let padded_range = run_range(&|name| match name {
            "attention_mask" => table(2, seq, &|r, t| i64::from(r == 0 || t < kept)),
            "token_type_ids" => table(2, seq, &|_, t| types(t)),
            _ => table(2, seq, &|r, t| if r == 1 && t >= kept { 0 } else { ids[r * seq + t] }),
        });
        let alone_range = run_range(&|name| match name {
            "attention_mask" => table(1, kept, &|_, _| 1),
            "token_type_ids" => table(1, kept, &|_, t| types(t)),
            _ => table(1, kept, &|_, t| ids[seq + t]),
        });
        let (e1, e2) = (rel_l2(&padded_range, &padded), rel_l2(&alone_range, &alone));
        println!(
            "{file}: one bundle for the ranges against static ones: 2×{seq} {e1:.2e}, 1×{kept} {e2:.2e}"
        );
        assert!(e1 <= FP32_TOLERANCE && e2 <= FP32_TOLERANCE, "{file}: {e1:e} {e2:e}");
    }
}

/// Outputs of `PINNED_MIN_BYTES` or more handed to the host in page-locked memory from the
/// session's pool (what the Python package's arrays are made over): the same bytes as a copy
/// into new memory, and a buffer given back is the next copy's.
#[test]
fn pinned_outputs_come_from_a_pool() {
    if !gpu() {
        return;
    }
    let file = "gpt2_ts.onnx";
    let import = fusec::import::ImportOptions::default().dim("batch", 32).dim("seq", 16);
    let bundle = fusec::compile(
        &common::model_path(file),
        &CompileOptions { import: import.clone(), ..Default::default() },
    )
    .unwrap();
    let model = fusec::import::import(&common::model_path(file), &import).unwrap();
    let mut session = Session::new(&bundle, 0).unwrap();
    let bytes_of = |words: Vec<u64>, len: usize| -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).take(len).collect()
    };
    session.run(&common::random_inputs(&model, 1)).unwrap();
    let size = |s: &Session, k: usize| s.output_type(k).unwrap().size_bytes();
    let k = (0..session.outputs().len()).max_by_key(|&k| size(&session, k)).unwrap();
    assert!(size(&session, k) >= fusec::runtime::PINNED_MIN_BYTES, "{} bytes", size(&session, k));
    let pinned = session.output_pinned(k).unwrap().expect("a large output in page-locked memory");
    let (words, len) = session.output_words(k).unwrap();
    assert_eq!(pinned.len(), len);
    assert_eq!(pinned.bytes(), bytes_of(words, len).as_slice());
    assert!(pinned.bytes().iter().any(|&b| b != 0));
    let address = pinned.as_ptr();
    drop(pinned);
    // Another run: the buffer given back holds its output.
    session.run(&common::random_inputs(&model, 2)).unwrap();
    let again = session.output_pinned(k).unwrap().unwrap();
    assert_eq!(again.as_ptr(), address);
    let (words, len) = session.output_words(k).unwrap();
    assert_eq!(again.bytes(), bytes_of(words, len).as_slice());
    // While it is held, the next copy is another buffer with the same bytes.
    let other = session.output_pinned(k).unwrap().unwrap();
    assert_ne!(other.as_ptr(), again.as_ptr());
    assert_eq!(other.bytes(), again.bytes());
    // A small output is left to new memory.
    if let Some(small) =
        (0..session.outputs().len()).find(|&j| size(&session, j) < fusec::runtime::PINNED_MIN_BYTES)
    {
        assert!(session.output_pinned(small).unwrap().is_none());
    }
    // Outputs outlive their session.
    drop(session);
    assert_eq!(other.bytes(), again.bytes());
}
