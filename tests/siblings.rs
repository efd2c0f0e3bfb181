//! Neighbouring elementwise kernels (pointwise, gathers, copies) that neither read nor
//! overwrite each other's memory run as one launch (`codegen::siblings`): in the Llama-style
//! decoder's step, the conversions of the four cached tensors, the rotary tables' kernels with
//! the embedding's gather, and each layer's rotary embeddings of its queries and
//! of its new key; in GPT-2's, its two embeddings' gathers.
//! Every merged launch goes through NVRTC; a kernel that reads another's output is never
//! merged with it; `FUSEC_MERGE_SIBLINGS=0` merges nothing. On a GPU, the step with its
//! launches merged against tract, in f16 and f32. With `FUSEC_REPEATS_AS_TILES=1` the
//! tables' concatenation is read as a Tile (one launch fewer). One test in this file: the knobs
//! are environment variables read at compile time.

mod common;

use std::collections::HashSet;

use fusec::codegen::Step;
use fusec::ir::{DType, NodeId};
use fusec::pipeline::CompileOptions;

/// The stored value behind `id` (through views), or where the views end.
fn stored(plan: &fusec::plan::Plan, id: NodeId) -> NodeId {
    let graph = &plan.graph;
    let at = |n: NodeId| plan.locations.contains_key(&n) || !graph.node(n).op.is_view();
    fusec::plan::stored_value(graph, id, &at).expect("a view chain ends")
}

#[test]
fn neighbouring_pointwise_kernels_run_as_one_launch() {
    fixture_steps_merge();
    decoding_steps_in_place_and_for_ranges_merge_their_rotary_kernels();
    repeats_as_tiles();
}

/// With `FUSEC_REPEATS_AS_TILES=1`, the rotary tables' concatenation of the frequencies with
/// themselves is a Tile read by the cosines' and sines' kernel: the Llama-style step with its
/// cache in place takes one launch fewer, every kernel through NVRTC; on a GPU, the step (its
/// cache copied) against tract in f16.
fn repeats_as_tiles() {
    let launches = || {
        let dims: Vec<fusec::import::DimSpec> =
            ["batch=1", "seq=1", "past=63", "total=past+seq"].iter().map(|d| d.parse().unwrap()).collect();
        let options = CompileOptions {
            import: fusec::import::ImportOptions::new(vec![], fusec::import::resolve_sums(dims).unwrap()),
            precision: DType::F16,
            cache_in_place: true,
            ..Default::default()
        };
        let path = common::model_path("llama_cache_ts.onnx");
        fusec::compile(&path, &options).unwrap_or_else(|e| panic!("{e}")).header.launches
    };
    let apart = launches();
    std::env::set_var("FUSEC_REPEATS_AS_TILES", "1");
    let tiled = launches();
    let (path, options) = common::decoding_step("llama_cache_ts.onnx", 1);
    let steps = common::compiled_steps(&path, &options);
    assert!(!steps.is_empty());
    let model = fusec::import::import(&path, &options.import).unwrap_or_else(|e| panic!("{e}"));
    let inputs = common::random_inputs(&model, 6);
    let values: Vec<_> = inputs.iter().map(|(_, t)| t.clone()).collect();
    let theirs = fusec::import::run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
    common::gpu_matches_tract(&path, &options, &inputs, &theirs, 1e-2);
    std::env::remove_var("FUSEC_REPEATS_AS_TILES");
    assert_eq!(tiled + 1, apart, "launches with the tables' Tile against without");
}

/// The Llama-style step of the fixture (its cache copied), f16 and f32.
fn fixture_steps_merge() {
    for precision in [DType::F16, DType::F32] {
        let (path, mut options) = common::decoding_step("llama_cache_ts.onnx", 1);
        options = CompileOptions { precision, ..options };
        let (plan, _) = fusec::pipeline::plan_reporting(&path, &options, &mut |_| {}).unwrap();
        std::env::set_var("FUSEC_MERGE_SIBLINGS", "0");
        let apart = common::compiled_steps(&path, &options);
        std::env::remove_var("FUSEC_MERGE_SIBLINGS");
        assert!(apart.iter().all(|s| !matches!(s, Step::Launch(k) if !k.merges.is_empty())));
        let steps = common::compiled_steps(&path, &options);
        assert_eq!(apart.len(), steps.len());
        let mut merged = 0;
        for (i, step) in steps.iter().enumerate() {
            let Step::Launch(kernel) = step else { continue };
            if kernel.merges.is_empty() {
                continue;
            }
            // A run of the steps right after it, all elementwise; none reads what an earlier
            // one of the run writes.
            let run: Vec<usize> = std::iter::once(i).chain(kernel.merges.iter().copied()).collect();
            assert_eq!(run, (i..i + run.len()).collect::<Vec<_>>(), "{precision}: {run:?}");
            let mut written = HashSet::new();
            for &k in &run {
                let part = &plan.kernels[k];
                use fusec::fusion::KernelKind;
                let elementwise =
                    matches!(part.kind, KernelKind::Pointwise | KernelKind::Gather | KernelKind::Copy);
                assert!(elementwise, "{precision}: step {k} is {:?}", part.kind);
                for &node in &part.nodes {
                    for input in plan.graph.inputs_of(node) {
                        let source = stored(&plan, input);
                        assert!(
                            !written.contains(&source),
                            "{precision}: step {k} reads an output of its run"
                        );
                    }
                }
                written.extend(part.outputs.iter().map(|&o| stored(&plan, o)));
            }
            // Each kernel's blocks, one after another; the steps it stands in for kept as they
            // were (their memory may lie elsewhere: the run's reads are kept alive longer).
            assert_eq!(kernel.grid, run.iter().map(|&k| launch(&apart[k]).grid).sum::<u32>());
            for &k in &run[1..] {
                let (ours, theirs) = (launch(&steps[k]), launch(&apart[k]));
                assert_eq!(
                    (&ours.function, ours.grid),
                    (&theirs.function, theirs.grid),
                    "{precision}: step {k}"
                );
            }
            merged += kernel.merges.len();
        }
        // In f16 the four cached tensors' conversions (three merged into the first), and each
        // of the two layers' rotary embeddings of Q and of K (one merged into the other); in
        // f32 (no conversions; the caches' concatenations between the rotary kernels) the
        // rotary tables' sines and cosines.
        let least = if precision == DType::F16 { 3 + 2 } else { 1 };
        assert!(merged >= least, "{precision}: {merged} steps merged");

        let model = fusec::import::import(&path, &options.import).unwrap_or_else(|e| panic!("{e}"));
        let inputs = common::random_inputs(&model, 5);
        let values: Vec<_> = inputs.iter().map(|(_, t)| t.clone()).collect();
        let theirs = fusec::import::run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
        let tolerance = if precision == DType::F32 { 1e-5 } else { 1e-2 };
        common::gpu_matches_tract(&path, &options, &inputs, &theirs, tolerance);
    }
}

fn launch(step: &Step) -> &fusec::codegen::KernelSource {
    match step {
        Step::Launch(kernel) => kernel,
        other => panic!("{other:?}"),
    }
}

/// What `fusec generate` compiles (a step with its cache in place, f16) merges the rotary
/// tables' kernels, the embedding's gather, and each layer's rotary embeddings of Q and K
/// (GPT-2: its two embeddings' gathers); a step for a range
/// of cache lengths (its kernels' launches following the range) merges those whose sizes do
/// not follow it, with the run-time bound a literal.
fn decoding_steps_in_place_and_for_ranges_merge_their_rotary_kernels() {
    let cases = [
        // The tables' cosines' and sines' kernels (one with `FUSEC_REPEATS_AS_TILES=1`) and
        // the token embedding's gather; two rotary pairs.
        ("llama_cache_ts.onnx", "past=63", true, 1 + 2),
        ("llama_cache_ts.onnx", "past=0..300", false, 1),
        // The token and position embeddings' gathers.
        ("gpt2_cache_ts.onnx", "past=63", true, 1),
    ];
    for (file, past, in_place, least) in cases {
        let dims: Vec<fusec::import::DimSpec> =
            ["batch=1", "seq=1", past, "total=past+seq"].iter().map(|d| d.parse().unwrap()).collect();
        let dims = fusec::import::resolve_sums(dims).unwrap();
        let options = CompileOptions {
            import: fusec::import::ImportOptions::new(vec![], dims),
            precision: DType::F16,
            cache_in_place: in_place,
            ..Default::default()
        };
        let path = common::model_path(file);
        let bundle = fusec::compile(&path, &options).unwrap_or_else(|e| panic!("{file} {past}: {e}"));
        let merged: Vec<&fusec::codegen::KernelSource> = bundle
            .header
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Launch(k) if !k.merges.is_empty() => Some(k),
                _ => None,
            })
            .collect();
        let count: usize = merged.iter().map(|k| k.merges.len()).sum();
        assert!(count >= least, "{file} {past}: {count} steps merged");
        // No run-time bound or range size left in a merged launch.
        for kernel in merged {
            assert!(kernel.scale.is_none() && !kernel.source.contains("fusec_limit"), "{}", kernel.source);
        }
    }
}
