//! The Q, K and V projection taken into the decoding attention kernel (`codegen::attention::qkv`):
//! at one sequence, the GPT-2 fixtures' attention steps run the product (and the norm before
//! it) themselves, those steps left out, their kernels through NVRTC and ptxas without spills
//! (CPU); at two sequences they do not. On a GPU, the one-sequence step's logits and presents
//! against tract in fp16 and bf16, at caches of 7 and 300 positions, with every position live
//! and with empty slots.

mod common;

use common::decoders::{compiled, one_token_inputs, step_matches_tract};
use fusec::codegen::Step;
use fusec::ir::DType;

const GPT2: [&str; 2] = ["gpt2_cache_ts.onnx", "gpt2_cache_dynamo.onnx"];

/// The decoding attention steps of `steps` and the steps each leaves out.
fn attention_merges(steps: &[Step]) -> Vec<Vec<usize>> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Launch(k) if k.source.contains("Attention of one query row") => Some(k.merges.clone()),
            _ => None,
        })
        .collect()
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
            // Two sequences: the product has two rows, and keeps its own step.
            let two = compiled(file, 2, 1, 16, precision, true);
            let merges = attention_merges(&two.header.steps);
            assert!(merges.len() == 2 && merges.iter().all(Vec::is_empty), "{file} {precision}: {merges:?}");
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
