//! Library GEMMs' kernels scheduled while the kernel before them finishes: in a captured CUDA
//! graph the edge into a cuBLAS(Lt) call's kernel is made programmatic where that kernel waits
//! for its predecessor itself (`runtime::session::library_edges`; kernels not known by name are
//! probed at run time, `library_probe`). On a GPU of sm_90 or later the fixtures' graphs hold
//! such edges, and every run's outputs stay tract's; without a GPU the test says that it
//! skipped.

mod common;

use fusec::ir::{rel_l2, DType};
use fusec::pipeline::CompileOptions;
use fusec::runtime::{Session, SessionOptions};

fn knob_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim() == "0")
}

/// `file` in f16 at 8 × 33, its GEMMs on the library (not timed, so no kernel of fusec's takes a
/// product),
/// generated kernels launched programmatically: five runs (the first step by step, then the
/// graph) each against tract; the graph's library kernels with programmatic edges, counted.
/// `None` without a GPU; else the count and whether one is expected (sm_90 or later, not
/// turned off).
fn library_kernels_scheduled_early(file: &str, seed: u64) -> Option<(usize, bool)> {
    let path = common::model_path(file);
    // 8 sequences of 33: products of 264 rows, which no kernel of fusec's takes.
    let import = common::dims_at(file, "8", "33");
    scheduled_early(&path, import, seed)
}

/// [`library_kernels_scheduled_early`] of the model at `path` imported with `import`.
fn scheduled_early(
    path: &std::path::Path,
    import: fusec::import::ImportOptions,
    seed: u64,
) -> Option<(usize, bool)> {
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
        SessionOptions { tune_gemms: false, programmatic_launch: true, ..Default::default() };
    let mut session = Session::with_options(&bundle, 0, session_options).unwrap_or_else(|e| panic!("{e}"));
    for run in 0..5 {
        let ours = session.run(&inputs).unwrap_or_else(|e| panic!("{file} run {run}: {e}"));
        for ((name, ours), theirs) in ours.iter().zip(&theirs) {
            let err = rel_l2(ours, theirs);
            assert!(err <= 1e-2, "{file} run {run}, output {name}: rel-L2 {err:e} against tract");
        }
    }
    let made = session.library_kernels_programmatic();
    for (kernel, waits) in fusec::runtime::probed_library_kernels() {
        println!("probed: {kernel} {}", if waits { "waits" } else { "does not wait" });
    }
    println!(
        "{file}: {made} library kernels with a programmatic edge ({}), outputs within 1e-2 of tract",
        session.arch
    );
    let major: u32 =
        session.arch.trim_start_matches("sm_").get(..1).and_then(|d| d.parse().ok()).unwrap_or(0);
    let expected = major >= 9 && !knob_off("FUSEC_LIBRARY_PDL") && !knob_off("FUSEC_PDL");
    Some((made, expected))
}

#[test]
fn library_kernels_with_programmatic_edges_give_tracts_outputs() {
    for (file, seed) in [("bert_ts.onnx", 31), ("gpt2_ts.onnx", 32)] {
        if let Some((made, expected)) = library_kernels_scheduled_early(file, seed) {
            assert!(!expected || made > 0, "{file}: no library kernel was given a programmatic edge");
        }
    }
}

/// Kernels whose machine code has no wait for their predecessor (`benches/NOTES.md`: none of
/// these families in `libcublasLt.so.13` has `ACQBULK`).
const NOT_WAITING: [&str; 4] = ["gemvx", "gemmSN", "gemmk", "sgemm_largek"];

/// A product of one f32 row on cuBLAS, whose kernels for so few rows are older ones: whatever
/// kernel it reaches is probed, the outputs stay tract's, and any probed kernel of a family
/// known not to wait is found not to (the probe tells the two apart).
#[test]
fn a_kernel_that_does_not_wait_is_found_so() {
    let dir = std::env::temp_dir().join(format!("fusec-library-edges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = vec![
        // A kernel of fusec's before the product (the edge's other end), no epilogue after it.
        common::onnx::node("Relu", &["x"], "r", vec![]),
        common::onnx::node("MatMul", &["r", "w"], "y", vec![]),
    ];
    let path = common::onnx::write_model(
        &dir,
        "one_row",
        &[1, 96],
        nodes,
        vec![common::onnx::weight("w", &[96, 200], 41, -0.5, 1.0)],
    );
    let Some((made, _)) = scheduled_early(&path, fusec::import::ImportOptions::default(), 33) else { return };
    let probed = fusec::runtime::probed_library_kernels();
    let known_not = |k: &str| NOT_WAITING.iter().any(|f| k.contains(f));
    for (kernel, waits) in &probed {
        assert!(!(known_not(kernel) && *waits), "{kernel} was found to wait, but its code has no wait");
    }
    if probed.iter().any(|(k, _)| known_not(k)) {
        assert_eq!(made, 0, "a session whose library kernel does not wait gave it a programmatic edge");
    } else {
        println!("no kernel of a family known not to wait was reached: {probed:?}");
    }
}
