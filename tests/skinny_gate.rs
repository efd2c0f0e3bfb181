//! A gated MLP (Llama's: `down(silu(x·Wg) · (x·Wu)) + x`) at a few rows: the gate and up
//! products merge into one (two slices of its output), and the down product's kernel for a
//! few rows computes `g · σ(g) · u` as it reads A, standing in for the pointwise kernel before
//! it (whose step it absorbs). At 1 and 3 rows, f32 and f16, awkward sizes; every kernel
//! through NVRTC (and ptxas where found: no spills); with `FUSEC_SKINNY_GATE=0` the pointwise
//! kernel stays, and it stays where the gates outgrow a block's shared memory; the Llama-style
//! decoder's step takes in every layer's gate. On a GPU, the models with the kernels forced
//! (and the MLP chosen by timing too), against tract. One test in this file: the knob is an
//! environment variable read at compile time.

mod common;

use std::path::{Path, PathBuf};

use common::onnx::{node, weight, write_model};
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;
use fusec::plan::Location;

/// `rows` rows of `width` through a gated MLP `inner` wide, with a residual.
fn gated_mlp(dir: &Path, rows: i64, width: i64, inner: i64) -> PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "wg"], "g", vec![]),
        node("MatMul", &["x", "wu"], "u", vec![]),
        node("Sigmoid", &["g"], "s", vec![]),
        node("Mul", &["g", "s"], "gs", vec![]),
        node("Mul", &["gs", "u"], "h", vec![]),
        node("MatMul", &["h", "wd"], "d", vec![]),
        node("Add", &["d", "x"], "y", vec![]),
    ];
    let init = vec![
        weight("wg", &[width, inner], 81, -0.2, 0.4),
        weight("wu", &[width, inner], 82, -0.2, 0.4),
        weight("wd", &[inner, width], 83, -0.2, 0.4),
    ];
    write_model(dir, &format!("gated{rows}_{width}_{inner}"), &[rows, width], nodes, init)
}

/// The down product's step (the last GEMM) and the index of the step it absorbs, if any.
fn down(steps: &[Step]) -> (&Step, Option<usize>) {
    let step = steps.iter().rev().find(|s| matches!(s, Step::Gemm { .. })).expect("a GEMM step");
    let Step::Gemm { absorbs, .. } = step else { unreachable!() };
    (step, *absorbs)
}

#[test]
fn a_gated_mlps_gate_is_computed_by_the_down_products_kernel() {
    let dir = tempfile::tempdir().unwrap();
    for (rows, width, inner) in [(1, 200, 264), (3, 136, 520)] {
        let path = gated_mlp(dir.path(), rows, width, inner);
        for precision in [DType::F32, DType::F16] {
            let options = CompileOptions { precision, ..Default::default() };
            std::env::set_var("FUSEC_SKINNY_GATE", "0");
            let apart = common::compiled_steps(&path, &options);
            assert_eq!(down(&apart).1, None, "{rows} rows, {precision}: a gate taken in with the knob at 0");

            std::env::remove_var("FUSEC_SKINNY_GATE");
            let steps = common::compiled_steps(&path, &options);
            let (step, absorbs) = down(&steps);
            let absorbed = absorbs.unwrap_or_else(|| panic!("{rows} rows, {precision}: the gate kept apart"));
            // The absorbed step is the pointwise kernel of the gate, right before the product.
            let Step::Launch(gate) = &steps[absorbed] else { panic!("{:?}", steps[absorbed]) };
            assert!(gate.source.contains("fusec::sigmoid"), "{}", gate.source);
            assert!(matches!(steps[absorbed + 1], Step::Gemm { .. }));
            let Step::Gemm { gemm, skinny: Some(kernel), .. } = step else { panic!("{step:?}") };
            assert_eq!((gemm.m, gemm.k), (rows as usize, inner as usize));
            // The block computes the gates once into shared memory, from both factors.
            assert!(kernel.source.contains("gates(a_in, a_term, gs)"), "{}", kernel.source);
            // x and y are the two halves of the merged gate-and-up product's rows: the second
            // `inner` elements after the first, rows `2 · inner` apart.
            let element = precision.size_bytes();
            let Location::Arena(x) = kernel.args[0] else { panic!("{:?}", kernel.args) };
            let y = Location::Arena(x + inner as usize * element);
            assert!(kernel.args[3..].contains(&y), "{:?}", kernel.args);
            assert!(kernel.source.contains(&format!("m * {}LL", 2 * inner)), "{}", kernel.source);
            if fusec::nvrtc::available() {
                common::compiles_without_spills(kernel, common::ptxas().as_deref(), dir.path());
            }
            let (_, inputs, theirs) = common::tract_on_random_inputs(&path, rows as u64);
            let tolerance = if precision == DType::F32 { 1e-5 } else { 1e-2 };
            for forced in ["1", ""] {
                std::env::set_var("FUSEC_SKINNY", forced);
                common::gpu_matches_tract(&path, &options, &inputs, &theirs, tolerance);
            }
            std::env::remove_var("FUSEC_SKINNY");
        }
    }
    // More gates than a block's shared memory holds (2 × 5,128 > 10,240): the gate stays apart.
    let path = gated_mlp(dir.path(), 2, 24, 5128);
    let steps =
        common::compiled_steps(&path, &CompileOptions { precision: DType::F16, ..Default::default() });
    assert_eq!(down(&steps).1, None, "a gate over the shared memory's size taken in");
    llama_steps_gates();
    std::env::remove_var("FUSEC_SKINNY_GATE");
}

/// The Llama-style decoder's step (the exporter's pattern: the gate and up products merged,
/// `g · σ(g)` then times `u`) at one sequence, fp16, by default: every layer's gate
/// kernel is absorbed by its down product's kernel, which goes through NVRTC and ptxas; on a
/// GPU, the step with the kernels forced against tract.
fn llama_steps_gates() {
    let (path, options) = common::decoding_step("llama_cache_ts.onnx", 1);
    let gate_kernel = |s: &Step| matches!(s, Step::Launch(k) if k.source.contains("fusec::sigmoid("));
    std::env::set_var("FUSEC_SKINNY_GATE", "0");
    let layers = common::compiled_steps(&path, &options).iter().filter(|s| gate_kernel(s)).count();
    assert!(layers > 0, "no gate kernel in the Llama-style step");
    std::env::remove_var("FUSEC_SKINNY_GATE");
    let steps = common::compiled_steps(&path, &options);
    let dir = tempfile::tempdir().unwrap();
    let mut absorbed = 0;
    for step in &steps {
        if let Step::Gemm { absorbs: Some(j), skinny: Some(kernel), .. } = step {
            if gate_kernel(&steps[*j]) {
                assert!(kernel.source.contains("gates(a_in, a_term, gs)"), "{}", kernel.source);
                if fusec::nvrtc::available() {
                    common::compiles_without_spills(kernel, common::ptxas().as_deref(), dir.path());
                }
                absorbed += 1;
            }
        }
    }
    assert_eq!(absorbed, layers, "every layer's gate taken in");
    common::forced_skinny_matches_tract(&path, &options, 4, 1e-2);
}
