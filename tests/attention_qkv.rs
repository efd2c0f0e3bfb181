//! The Q, K and V projection taken into the decoding attention kernel (`codegen::attention::qkv`):
//! at one sequence, the GPT-2 fixtures' attention steps run the product (and the norm before
//! it) themselves, those steps left out, their kernels through NVRTC and ptxas without spills
//! (CPU). At 2 to 16 sequences the batch's kernel (`codegen::attention::rows`) does the same
//! (to 32 with `FUSEC_ATTENTION_QKV_ROWS=32`, two clusters a head past 16); past that the
//! product keeps its own step. On a GPU, the steps' logits and presents against
//! tract in fp16 and bf16, at caches of 7 and 300 positions, with every position live and with
//! empty slots (at a batch, each sequence at a length of its own).

mod common;

use common::decoders::{compiled, one_token_inputs, step_matches_tract};
use fusec::codegen::Step;
use fusec::ir::DType;

const GPT2: [&str; 2] = ["gpt2_cache_ts.onnx", "gpt2_cache_dynamo.onnx"];

/// The steps each launch of `steps` whose source says `about` leaves out.
fn merges_of(steps: &[Step], about: &str) -> Vec<Vec<usize>> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Launch(k) if k.source.contains(about) => Some(k.merges.clone()),
            _ => None,
        })
        .collect()
}

/// The one-row decoding attention steps of `steps` and the steps each leaves out.
fn attention_merges(steps: &[Step]) -> Vec<Vec<usize>> {
    merges_of(steps, "Attention of one query row")
}

#[test]
fn the_projection_joins_the_decoding_attention_at_one_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let ptxas = common::ptxas();
    for file in GPT2 {
        for precision in [DType::F16, DType::BF16] {
            let bundle = compiled(file, 1, 1, 16, precision, true);
            let steps = &bundle.header.steps;
            let merges = attention_merges(steps);
            assert_eq!(merges.len(), 2, "{file} {precision}: {merges:?}");
            for merged in &merges {
                // The product's step, right before the attention's, and in fp16 the norm's
                // kernel before it (in bf16 the norm is not of the product's element type, and
                // runs apart).
                let (norm, product) = match merged[..] {
                    [norm, product] => (Some(norm), product),
                    [product] if precision == DType::BF16 => (None, product),
                    _ => panic!("{file} {precision}: merges {merged:?}"),
                };
                assert!(matches!(steps[product], Step::Gemm { .. }), "{file} {precision}: step {product}");
                if let Some(norm) = norm {
                    assert_eq!(product, norm + 1, "{file} {precision}");
                    match &steps[norm] {
                        Step::Launch(k) => {
                            // (An RMSNorm of the deviations: its scale and shift are in the
                            // product's weights and bias, `passes::FoldNormScales`.)
                            assert!(k.name.contains("rmsnorm"), "{file} {precision}: {}", k.name)
                        }
                        _ => panic!("{file} {precision}: step {norm} is not the norm's kernel"),
                    }
                }
                let attention = steps.iter().position(|s| match s {
                    Step::Launch(k) => &k.merges == merged,
                    _ => false,
                });
                assert_eq!(attention, Some(product + 1), "{file} {precision}");
            }
            if fusec::nvrtc::available() {
                for source in steps.iter().flat_map(Step::sources).filter(|k| !k.merges.is_empty()) {
                    common::compiles_without_spills(source, ptxas.as_deref(), dir.path());
                }
            }
        }
    }
}

/// The steps of the kernel that computes a batch's projection (`codegen::attention::rows`).
fn rows_merges(steps: &[Step]) -> Vec<Vec<usize>> {
    merges_of(steps, "A decoding step of")
}

/// The most sequences at which the batch's kernel is used: `FUSEC_ATTENTION_QKV_ROWS` where
/// set (a run with it at 32 checks the two clusters a head that 17 to 32 rows take), else 16.
fn most_rows() -> usize {
    std::env::var("FUSEC_ATTENTION_QKV_ROWS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(16).min(32)
}

#[test]
fn the_projection_joins_the_decoding_attention_of_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ptxas = common::ptxas();
    for file in GPT2 {
        for precision in [DType::F16, DType::BF16] {
            for batch in [2, 13, 16, 17, 32].into_iter().filter(|&b| b <= most_rows()) {
                let what = format!("{file} {precision} batch {batch}");
                let bundle = compiled(file, batch, 1, 16, precision, true);
                let steps = &bundle.header.steps;
                let merges = rows_merges(steps);
                assert_eq!(merges.len(), 2, "{what}: {merges:?}");
                assert!(attention_merges(steps).is_empty(), "{what}: the one-row kernel too");
                for merged in &merges {
                    // The product's step right before the attention's (and the norm's before
                    // it, where the norm is of the product's element type).
                    let product = *merged.last().unwrap_or_else(|| panic!("{what}: nothing merged"));
                    assert!(matches!(steps[product], Step::Gemm { .. }), "{what}: step {product}");
                    if let [norm, _] = merged[..] {
                        assert_eq!(product, norm + 1, "{what}");
                    }
                    let attention =
                        steps.iter().position(|s| matches!(s, Step::Launch(k) if &k.merges == merged));
                    assert_eq!(attention, Some(product + 1), "{what}");
                }
                if fusec::nvrtc::available() {
                    for source in steps.iter().flat_map(Step::sources).filter(|k| !k.merges.is_empty()) {
                        common::compiles_without_spills(source, ptxas.as_deref(), dir.path());
                        // Before sm_90 (no clusters) the kernel takes its other way: it
                        // compiles too.
                        if batch == 2 {
                            let ptx = fusec::nvrtc::compile(source, "sm_80");
                            assert!(ptx.is_ok_and(|p| p.contains(&source.function)), "{what}: sm_80");
                        }
                    }
                }
            }
            // Past them the product keeps its own step.
            for batch in [17, 32, 33].into_iter().filter(|&b| b > most_rows()) {
                let many = compiled(file, batch, 1, 16, precision, true);
                let merges = rows_merges(&many.header.steps);
                assert!(merges.is_empty(), "{file} {precision} batch {batch}: {merges:?}");
            }
        }
    }
}

#[test]
fn one_sequence_with_the_projection_matches_tract() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the projection inside the attention is checked on a GPU machine)");
        return;
    }
    for file in GPT2 {
        for (precision, past) in [(DType::F16, 7usize), (DType::F16, 300), (DType::BF16, 300)] {
            let bundle = compiled(file, 1, 1, past, precision, true);
            assert!(attention_merges(&bundle.header.steps).iter().all(|m| !m.is_empty()), "{file}");
            let total = past + 1;
            // Every position live; then the cache half full (empty slots before the new one).
            let masks =
                [vec![1i64; total], (0..total).map(|t| i64::from(t < past / 2 || t == past)).collect()];
            for (m, mask) in masks.iter().enumerate() {
                let (inputs, values) = common::in_bundle_types(
                    &bundle,
                    one_token_inputs(file, 1, past, mask, 5.0, 60 + m as u64),
                );
                let what = format!("{file} {precision} past {past} mask {m}");
                step_matches_tract(&bundle, file, &inputs, &values, 1e-2, &what);
            }
        }
    }
}

#[test]
fn a_batch_with_the_projection_matches_tract() {
    if !fusec::runtime::driver_available() {
        println!(
            "skipped: no CUDA driver (a batch's projection inside the attention is checked on a GPU machine)"
        );
        return;
    }
    for file in GPT2 {
        for (precision, past, batch) in [
            (DType::F16, 7usize, 2usize),
            (DType::F16, 300, 13),
            (DType::F16, 300, 16),
            (DType::BF16, 300, 16),
            (DType::F16, 300, 32),
            (DType::BF16, 300, 32),
        ] {
            if batch > most_rows() {
                continue;
            }
            let bundle = compiled(file, batch, 1, past, precision, true);
            assert_eq!(rows_merges(&bundle.header.steps).len(), 2, "{file}");
            let masks = common::decoders::batch_masks(batch, past);
            for (m, mask) in masks.iter().enumerate() {
                let (inputs, values) = common::in_bundle_types(
                    &bundle,
                    one_token_inputs(file, batch, past, mask, 5.0, 70 + m as u64),
                );
                let what = format!("{file} {precision} past {past} batch {batch} mask {m}");
                step_matches_tract(&bundle, file, &inputs, &values, 1e-2, &what);
            }
        }
    }
}
