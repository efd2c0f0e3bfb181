//! The output projection taken into the decoding attention kernel of a batch
//! (`codegen::attention::outproj`): at 24 and 32 sequences (past the batches whose attention
//! computes its Q, K and V projection) the GPT-2 fixtures' attention steps compute the product
//! after them, those steps left out, the plan's memory for the partial products set aside,
//! their kernels through NVRTC and ptxas without spills (and, before sm_90, the way without
//! clusters through NVRTC) on the CPU. Batches not a multiple of the cluster's 8 sequences
//! keep the product's step. On a GPU, the steps' logits and presents against tract in fp16 and
//! bf16, at caches of 7 and 300 positions, every position live and each sequence at a length
//! of its own. Off by default (measured slower), the tests turn it on
//! (`FUSEC_ATTENTION_OUTPROJ=1`, which every test of this file sets).

mod common;

use common::decoders::{compiled, one_token_inputs};
use fusec::codegen::Step;
use fusec::ir::DType;

const GPT2: [&str; 2] = ["gpt2_cache_ts.onnx", "gpt2_cache_dynamo.onnx"];

/// The knob that turns the projection inside the attention on, read at compile time (every
/// test of this file sets it alike, so they may run side by side).
fn turned_on() {
    std::env::set_var("FUSEC_ATTENTION_OUTPROJ", "1");
}

/// Each one-row decoding attention step of `steps` with the steps it leaves out.
fn attention_merges(steps: &[Step]) -> Vec<(usize, Vec<usize>)> {
    steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Step::Launch(k) if k.source.contains("Attention of one query row") => Some((i, k.merges.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn the_output_projection_joins_a_batch_s_decoding_attention() {
    turned_on();
    let dir = tempfile::tempdir().unwrap();
    let ptxas = common::ptxas();
    for file in GPT2 {
        for precision in [DType::F16, DType::BF16] {
            for batch in [24, 32] {
                let what = format!("{file} {precision} batch {batch}");
                let bundle = compiled(file, batch, 1, 16, precision, true);
                let steps = &bundle.header.steps;
                let merges = attention_merges(steps);
                assert_eq!(merges.len(), 2, "{what}: {merges:?}");
                for (attention, merged) in &merges {
                    // The product's step, right after the attention's, and nothing else.
                    assert_eq!(merged, &vec![attention + 1], "{what}");
                    match &steps[attention + 1] {
                        Step::Gemm { gemm, .. } => assert_eq!(gemm.m, batch, "{what}"),
                        _ => panic!("{what}: step {} is not the product's", attention + 1),
                    }
                }
                let source = |i: usize| match &steps[i] {
                    Step::Launch(k) => k,
                    _ => unreachable!(),
                };
                assert!(source(merges[0].0).source.contains("The output projection"), "{what}");
                if fusec::nvrtc::available() {
                    for (attention, _) in &merges {
                        let kernel = source(*attention);
                        common::compiles_without_spills(kernel, ptxas.as_deref(), dir.path());
                        let ptx = fusec::nvrtc::compile(kernel, "sm_80");
                        assert!(ptx.is_ok_and(|p| p.contains(&kernel.function)), "{what}: sm_80");
                    }
                }
            }
            // At a batch the cluster does not divide, the product keeps its step; below 17 the
            // attention computes its Q, K and V projection instead.
            for batch in [8, 33] {
                let bundle = compiled(file, batch, 1, 16, precision, true);
                let merges = attention_merges(&bundle.header.steps);
                assert!(
                    merges.iter().all(|(_, m)| m.is_empty()),
                    "{file} {precision} batch {batch}: {merges:?}"
                );
            }
        }
    }
}

/// The memory the partial products meet in lies past every value's in the activation arena
/// (the counters in it must stay as the kernels leave them), at 32 sequences; at 33 there is
/// none.
#[test]
fn the_partials_have_memory_of_their_own() {
    turned_on();
    use fusec::plan::Location;
    let file = GPT2[0];
    let plan = |batch: usize| {
        let options = fusec::CompileOptions {
            import: fusec::import::ImportOptions::new(common::decoders::specs(file, batch, 1, 16), vec![]),
            precision: DType::F16,
            cache_in_place: true,
            ..Default::default()
        };
        fusec::pipeline::plan_reporting(&common::model_path(file), &options, &mut |_| {}).unwrap().0
    };
    let with = plan(32);
    let Some(Location::Arena(scratch)) = with.scratch else { panic!("no scratch: {:?}", with.scratch) };
    // [32 rows, 4 heads, 64 columns] of f32, and a counter a row.
    assert!(scratch + 32 * 4 * 64 * 4 + 32 * 4 <= with.arena_bytes, "{scratch} of {}", with.arena_bytes);
    for (&id, location) in &with.locations {
        if let Location::Arena(offset) = *location {
            let end = offset + with.graph.node(id).ty.size_bytes();
            assert!(
                end <= scratch,
                "'{}' at {offset}..{end} meets the scratch at {scratch}",
                with.graph.node(id).name
            );
        }
    }
    assert_eq!(plan(33).scratch, None);
}

#[test]
fn a_batch_with_the_output_projection_matches_tract() {
    turned_on();
    if !fusec::runtime::driver_available() {
        println!(
            "skipped: no CUDA driver (a batch's output projection inside the attention is checked on a GPU machine)"
        );
        return;
    }
    for file in GPT2 {
        for (precision, past, batch) in
            [(DType::F16, 7usize, 24usize), (DType::F16, 300, 32), (DType::BF16, 300, 32)]
        {
            let bundle = compiled(file, batch, 1, past, precision, true);
            assert_eq!(
                attention_merges(&bundle.header.steps).iter().filter(|(_, m)| !m.is_empty()).count(),
                2
            );
            let masks = common::decoders::batch_masks(batch, past);
            for (m, mask) in masks.iter().enumerate() {
                let (inputs, values) = common::in_bundle_types(
                    &bundle,
                    one_token_inputs(file, batch, past, mask, 5.0, 90 + m as u64),
                );
                let what = format!("{file} {precision} past {past} batch {batch} mask {m}");
                // Twice on one session: the counters the last blocks clear must be clear again.
                let mut session = fusec::Session::new(&bundle, 0).unwrap();
                for _ in 0..2 {
                    common::decoders::session_matches_tract(
                        &mut session,
                        file,
                        &inputs,
                        &values,
                        1e-2,
                        &what,
                    );
                }
            }
        }
    }
}
