//! A norm taken into the tensor-core kernel for tens of rows folded (`FUSEC_SKINNY_MMA_FOLD=1`):
//! A's rows scaled by the norm's scale as they are read for the products, each row's statistics
//! summed from the same loads, and taken out after the sums with the products of the scale (and
//! the shift) as rows of A of their own. A test binary of its own, since it sets the knob for
//! the whole process (and leaves it set: its tests run side by side), with
//! `FUSEC_FOLD_NORMS=0`: the norms keep their scales (`passes::FoldNormScales`, whose norms
//! `tests/norm_scales.rs` takes in).

mod common;

use common::onnx::normed_block;
use fusec::codegen::Step;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

/// With `FUSEC_SKINNY_MMA_FOLD=1` the tensor-core kernel takes the LayerNorm before it in
/// folded (the rows' statistics summed from A as it is read, taken out after the sums, the
/// scale's and the shift's products as rows of their own): GPT-2 small's sizes at 32 rows (two
/// rows past four tiles: a fifth), and awkward ones at 29 (the two rows in the last tile's
/// padding) and 7, in f16. Every such kernel through NVRTC (no spills); on a GPU, forced and
/// chosen by timing, against tract, in f16 and bf16.
#[test]
fn a_norm_folded_into_the_tensor_core_kernel_matches_tract() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("FUSEC_SKINNY_MMA_FOLD", "1");
    std::env::set_var("FUSEC_FOLD_NORMS", "0");
    for (rows, width, inner) in [(32, 768, 2304), (29, 352, 328), (7, 96, 200)] {
        let path = normed_block(dir.path(), rows, width, inner);
        // (In bf16 the sum `h` stays f32, as the residual stream does, and the norm apart.)
        let precision = DType::F16;
        let steps = common::compiled_steps(&path, &CompileOptions { precision, ..Default::default() });
        let folded = common::absorbing_kernels(&steps);
        assert_eq!(folded.len(), 1, "{rows} × {width} × {inner}, {precision}: the norm taken in once");
        let k = folded[0];
        assert!(k.source.contains("on tensor cores") && k.source.contains("Σ γ·B, Σ β·B"), "{}", k.source);
        assert!(k.source.contains("h_out") && !k.source.contains("statistics(a_in"), "{}", k.source);
        if fusec::nvrtc::available() {
            common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
        }
        common::forced_and_timed_match_tract(
            &path,
            rows as u64 + 100,
            &[(DType::F16, 1e-2), (DType::BF16, 3e-2)],
        );
    }
}

/// A decoding step of the cache fixtures with the norms folded: GPT-2's LayerNorms (of a sum,
/// stored for the layers after) and the Llama-style decoder's RMSNorms, each before a product
/// with weights stored `[K, N]` (two a layer, two layers, and the vocabulary's), at 7, 13 and
/// 32 rows. Every such kernel through NVRTC
/// (no spills); on a GPU, the kernels forced, against tract.
#[test]
fn a_decoding_steps_norms_fold_into_the_tensor_core_kernels() {
    std::env::set_var("FUSEC_SKINNY_MMA_FOLD", "1");
    std::env::set_var("FUSEC_FOLD_NORMS", "0");
    for (file, rms, batch) in [
        ("gpt2_cache_ts.onnx", false, 13),
        ("gpt2_cache_ts.onnx", false, 32),
        ("llama_cache_ts.onnx", true, 7),
        ("llama_cache_ts.onnx", true, 32),
    ] {
        let (path, options) = common::decoding_step(file, batch);
        let steps = common::compiled_steps(&path, &options);
        let dir = tempfile::tempdir().unwrap();
        let mut folded = 0;
        for step in &steps {
            let Step::Gemm { absorbs: Some(_), skinny: Some(k), .. } = step else { continue };
            if k.source.contains("A = x·σ(x)·y") {
                continue;
            }
            assert!(!k.source.contains("statistics(a_in"), "{}", k.source);
            assert_eq!(k.source.contains("Σ γ·B"), !rms, "{}", k.source);
            if fusec::nvrtc::available() {
                common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
            }
            folded += 1;
        }
        // Every norm kernel of the step is taken in (the last before the vocabulary too: the
        // fixtures' are stored `[K, N]`).
        let absorbed: Vec<usize> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Gemm { absorbs: Some(j), skinny: Some(_), .. } => Some(*j),
                _ => None,
            })
            .collect();
        for (j, step) in steps.iter().enumerate() {
            if let Step::Launch(kernel) = step {
                let norm = kernel.name.contains("layernorm") || kernel.name.contains("rmsnorm");
                assert!(!norm || absorbed.contains(&j), "{file} at {batch}: {} is not taken in", kernel.name);
            }
        }
        assert_eq!(folded, 5, "{file} at {batch}");
        common::forced_skinny_matches_tract(&path, &options, 5, 1e-2);
    }
}
