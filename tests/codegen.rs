//! Code generation for every fixture, fused and unfused.

mod common;

use std::collections::HashMap;

use fusec::codegen::{self, Step};
use fusec::fusion::{self, partition, FusionLimits, Mode};
use fusec::import::import;
use fusec::ir::DType;
use fusec::passes::{run_passes, standard};
use fusec::plan::Plan;

/// (fixture, fused?) → the program's steps, f32; then every fixture fused in f16 and bf16.
pub fn programs() -> Vec<(String, bool, Vec<Step>)> {
    let mut out = f32_programs();
    for file in common::all_fixtures() {
        for precision in [DType::F16, DType::BF16] {
            let import = common::shape_variants(&file).remove(0);
            let options = fusec::CompileOptions { import, precision, ..Default::default() };
            let bundle = fusec::compile(&common::model_path(&file), &options)
                .unwrap_or_else(|e| panic!("{file} {precision}: {e}"));
            out.push((format!("{file} {precision}"), true, bundle.header.steps));
        }
    }
    out
}

fn f32_programs() -> Vec<(String, bool, Vec<Step>)> {
    let mut out = Vec::new();
    for file in common::all_fixtures() {
        let options = common::shape_variants(&file).remove(0);
        let model = import(&common::model_path(&file), &options).unwrap();
        let mut graph = model.graph.clone();
        run_passes(&mut graph, &standard()).unwrap();
        let fused = fusion::fuse(&graph, &FusionLimits::default()).unwrap();
        for (is_fused, graph, covers, mode) in [
            (true, fused.graph.clone(), fused.covers.clone(), Mode::Fused),
            (false, model.graph.clone(), HashMap::new(), Mode::OneKernelPerNode),
        ] {
            let part = partition(&graph, &covers, mode).unwrap();
            let plan = Plan::new(graph, part).unwrap_or_else(|e| panic!("{file} fused={is_fused}: {e}"));
            let steps = codegen::generate(&plan).unwrap_or_else(|e| panic!("{file} fused={is_fused}: {e}"));
            out.push((file.clone(), is_fused, steps));
        }
    }
    out
}

#[test]
fn every_fixture_generates() {
    for (file, fused, steps) in programs() {
        assert!(!steps.is_empty(), "{file} {fused}");
    }
}

/// Every generated kernel compiles with NVRTC for sm_90, and ptxas reports no spills.
#[test]
fn every_kernel_compiles_for_sm90_without_spills() {
    if !fusec::runtime::nvrtc::available() {
        println!("skipped: NVRTC not found (set LD_LIBRARY_PATH to a CUDA 13 lib/ with libnvrtc.so.13)");
        return;
    }
    assert!(
        fusec::runtime::nvrtc::cuda_include_dir().is_some(),
        "NVRTC is here but cuda_fp16.h is not: set FUSEC_CUDA_INCLUDE"
    );
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let mut seen = std::collections::HashSet::new();
    let (mut compiled, mut checked) = (0, 0);
    for (file, fused, steps) in programs() {
        for source in steps.iter().flat_map(|s| s.sources()) {
            if !seen.insert(source.source.clone()) {
                continue;
            }
            let ptx = fusec::runtime::nvrtc::compile(source, "sm_90")
                .unwrap_or_else(|e| panic!("{file} fused={fused}: {e}"));
            compiled += 1;
            let Some(ptxas) = &ptxas else { continue };
            let path = dir.path().join(format!("{}.ptx", source.name));
            std::fs::write(&path, &ptx).unwrap();
            let out = std::process::Command::new(ptxas)
                .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
                .arg(&path)
                .output()
                .unwrap();
            let report = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{file} {}: ptxas failed: {report}", source.name);
            assert!(
                report.contains("0 bytes spill stores, 0 bytes spill loads"),
                "{file} {}: {report}",
                source.name
            );
            checked += 1;
        }
    }
    println!("{compiled} distinct kernels compiled, {checked} checked by ptxas");
    assert!(compiled > 100);
    if ptxas.is_none() {
        println!("ptxas not found: spill check skipped (set FUSEC_PTXAS or put ptxas on PATH)");
    }
}

/// Kernels compiled once are read back from the cache, keyed by source, arch and NVRTC version.
#[test]
fn nvrtc_cache_is_reused() {
    if !fusec::runtime::nvrtc::available() {
        println!("skipped: NVRTC not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("FUSEC_CACHE_DIR", dir.path());
    let (_, _, steps) = programs().into_iter().find(|(f, fused, _)| f == "mlp_block.onnx" && *fused).unwrap();
    let source = steps.iter().flat_map(|s| s.sources()).next().unwrap().clone();
    let first = fusec::runtime::nvrtc::compile_cached(&source, "sm_90").unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1);
    let again = fusec::runtime::nvrtc::compile_cached(&source, "sm_90").unwrap();
    assert_eq!(first, again);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    let other_arch = fusec::runtime::nvrtc::compile_cached(&source, "sm_80").unwrap();
    assert_ne!(other_arch, first);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// GEMM epilogues that are a bias vector then at most ReLU or tanh-GELU run inside cuBLASLt
/// (one launch); erf-GELU, which cuBLASLt does not have, keeps its epilogue kernel.
#[test]
fn cublaslt_takes_bias_and_tanh_gelu_epilogues_only() {
    use fusec::codegen::LtActivation;
    let lt_epilogues = |file: &str| {
        let import = common::shape_variants(file).remove(0);
        let bundle = fusec::compile(
            &common::model_path(file),
            &fusec::CompileOptions { import, ..Default::default() },
        )
        .unwrap();
        let mut seen = Vec::new();
        for step in &bundle.header.steps {
            if let Step::Gemm { gemm, epilogue: Some(kernel) } = step {
                seen.push((
                    kernel.name.split('_').skip(2).collect::<Vec<_>>().join("_"),
                    gemm.lt_epilogue.map(|e| e.activation),
                ));
            }
        }
        seen
    };
    let gpt2 = lt_epilogues("gpt2_ts.onnx");
    assert!(
        gpt2.iter().any(|(kind, lt)| kind == "gemm_gelutanh" && *lt == Some(LtActivation::GeluTanh)),
        "{gpt2:?}"
    );
    assert!(gpt2.iter().all(|(_, lt)| lt.is_some()), "{gpt2:?}");
    let bert = lt_epilogues("bert_ts.onnx");
    for (kind, lt) in &bert {
        match kind.as_str() {
            "gemm_bias" => assert_eq!(*lt, Some(LtActivation::None), "{bert:?}"),
            "gemm_bias_gelu" => assert_eq!(*lt, None, "{bert:?}"),
            other => panic!("unexpected GEMM kernel {other}: {bert:?}"),
        }
    }
    assert!(bert.iter().any(|(_, lt)| lt.is_none()) && bert.iter().any(|(_, lt)| lt.is_some()));
}
