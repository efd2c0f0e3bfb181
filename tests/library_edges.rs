//! Library GEMMs' kernels scheduled while the kernel before them finishes: in a captured CUDA
//! graph the edge into a cuBLAS(Lt) call's kernel is made programmatic where that kernel waits
//! for its predecessor itself (`runtime::session::library_edges`; kernels not known by name are
//! probed at run time, `library_probe`). On a GPU every run's outputs stay tract's while the
//! edges are tried (the products' candidate algorithms timed with them at load, each kernel
//! reached looked up or probed), only kernels that wait are left with an edge, and a kernel of a
//! family whose code has no wait is found not to; without a GPU the test says that it skipped.

mod common;

use std::path::Path;

use fusec::import::ImportOptions;
use fusec::ir::{rel_l2, DType};
use fusec::pipeline::CompileOptions;
use fusec::runtime::{Session, SessionOptions};

/// Kernels whose machine code has no wait for their predecessor (`benches/NOTES.md`, forty-sixth
/// session: none of these families in `libcublasLt.so.13` has `ACQBULK`).
const NOT_WAITING: [&str; 4] = ["gemvx", "gemmSN", "gemmk", "sgemm_largek"];

/// The model at `path` (imported with `import`) in f16, its generated kernels launched
/// programmatically, its GEMMs' algorithms timed at load (`tune`) or the heuristic's first:
/// five runs (the first step by step, then the graph) each against tract. The library kernels
/// left with a programmatic edge in the graph; `None` without a GPU.
fn edges_of(path: &Path, import: ImportOptions, seed: u64, tune: bool) -> Option<Vec<String>> {
    let file = path.display();
    let (_, inputs, theirs) = common::tract_on_random_inputs_with(path, &import, seed);
    if !fusec::runtime::driver_available() {
        println!("skipped the GPU runs of {file}: no CUDA driver on this machine");
        return None;
    }
    let options =
        CompileOptions { import, precision: DType::F16, arch: Some("sm_90".into()), ..Default::default() };
    let bundle = fusec::compile(path, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
    let session_options =
        SessionOptions { tune_gemms: tune, programmatic_launch: true, ..Default::default() };
    let mut session = Session::with_options(&bundle, 0, session_options).unwrap_or_else(|e| panic!("{e}"));
    for run in 0..5 {
        let ours = session.run(&inputs).unwrap_or_else(|e| panic!("{file} run {run}: {e}"));
        for ((name, ours), theirs) in ours.iter().zip(&theirs) {
            let err = rel_l2(ours, theirs);
            assert!(err <= 1e-2, "{file} run {run}, output {name}: rel-L2 {err:e} against tract");
        }
    }
    let made = session.library_kernels_programmatic();
    println!("{file} (tuned: {tune}): library kernels with a programmatic edge: {made:?}; outputs within 1e-2 of tract");
    Some(made)
}

/// Every kernel left with an edge is one found (or known) to wait.
fn all_wait(made: &[String]) {
    let probed = fusec::runtime::probed_library_kernels();
    for (kernel, waits) in &probed {
        println!("probed: {kernel} {}", if *waits { "waits" } else { "does not wait" });
    }
    for kernel in made {
        let known = kernel.starts_with("sm90_xmma_gemm_");
        let found = probed.iter().any(|(k, waits)| k == kernel && *waits);
        assert!(known || found, "{kernel} has a programmatic edge but was not found to wait");
    }
}

#[test]
fn library_edges_only_into_kernels_that_wait() {
    for (file, seed) in [("bert_ts.onnx", 31), ("gpt2_ts.onnx", 32)] {
        // 8 sequences of 33: products of 264 rows, which no kernel of fusec's takes.
        let path = common::model_path(file);
        for tune in [false, true] {
            if let Some(made) = edges_of(&path, common::dims_at(file, "8", "33"), seed, tune) {
                all_wait(&made);
            }
        }
    }
}

/// A product of one f32 row on cuBLAS after a kernel of fusec's: whatever kernel it reaches is
/// probed and the outputs stay tract's; a probed kernel of a family whose code has no wait is
/// found not to, and is left without an edge.
#[test]
fn a_kernel_that_does_not_wait_is_found_so() {
    let dir = std::env::temp_dir().join(format!("fusec-library-edges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = vec![
        common::onnx::node("Relu", &["x"], "r", vec![]),
        common::onnx::node("MatMul", &["r", "w"], "y", vec![]),
    ];
    let weights = vec![common::onnx::weight("w", &[96, 200], 41, -0.5, 1.0)];
    let path = common::onnx::write_model(&dir, "one_row", &[1, 96], nodes, weights);
    let Some(made) = edges_of(&path, ImportOptions::default(), 33, false) else { return };
    all_wait(&made);
    let probed = fusec::runtime::probed_library_kernels();
    let known_not = |k: &str| NOT_WAITING.iter().any(|f| k.contains(f));
    for (kernel, waits) in &probed {
        assert!(!(known_not(kernel) && *waits), "{kernel} was found to wait, but its code has no wait");
    }
    if !probed.iter().any(|(k, _)| known_not(k)) {
        println!("no kernel of a family known not to wait was reached: {probed:?}");
    }
}
