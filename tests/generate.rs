//! Decoding with a key/value cache: the cache layout a one-step bundle of the decoder
//! fixtures has (CPU), and generated tokens against a reference that recomputes the whole
//! sequence without a cache (tract, CPU) — on the GPU, skipped without one.

mod common;

use common::decoders::{
    cache_dims, compiled, one_token_inputs, reference_tokens, specs, step_matches_tract, DECODERS,
};

use fusec::generate::{CacheLayout, GenerateOptions, Generator};
use fusec::import::{run_tract, ImportOptions};
use fusec::ir::{DType, Tensor};
use fusec::{Bundle, CompileOptions};
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

fn step_bundle(file: &str, batch: usize, capacity: usize, precision: DType) -> Bundle {
    prompt_bundle(file, batch, 1, capacity, precision)
}

/// `file` compiled for `seq` tokens a sequence after a cache of `capacity` (1: the one-token
/// step; more: a prompt step).
fn prompt_bundle(file: &str, batch: usize, seq: usize, capacity: usize, precision: DType) -> Bundle {
    compiled(file, batch, seq, capacity, precision, false)
}

/// Compiled with the cache updated in place, each `past_key_values` input lies inside its
/// `present` output (same place, rows `capacity + 1` positions apart), both in the storage type
/// (bf16 too: the mixed policy keeps a cache in bf16, as attention reads it);
/// the step no longer converts or copies the cache: fewer kernels in half types, and at least the copy's
/// bytes (every cached tensor read and written once) fewer moved. The prompt step's cache is
/// in place the same way, `capacity + seq` apart.
#[test]
fn a_cache_updated_in_place_lies_inside_its_output() {
    for file in DECODERS {
        let (heads, size) = cache_dims(file);
        for precision in [DType::F32, DType::F16, DType::BF16] {
            let copied = step_bundle(file, 2, 9, precision);
            let bundle = compiled(file, 2, 1, 9, precision, true);
            let h = &bundle.header;
            let layout = CacheLayout::of(&h.inputs, &h.outputs).unwrap();
            let element = precision.size_bytes();
            for pair in &layout.pairs {
                let past = h.inputs.iter().find(|s| s.name == pair.past).unwrap();
                let present = h.outputs.iter().find(|s| s.name == pair.present).unwrap();
                let inside =
                    past.inside.as_ref().unwrap_or_else(|| panic!("{file}: {} not in place", pair.past));
                assert_eq!(inside.output, pair.present);
                assert_eq!(past.location, present.location, "{file} {}", pair.past);
                assert_eq!(
                    (past.dtype.as_str(), present.dtype.as_str()),
                    (precision.name(), precision.name())
                );
                assert_eq!(
                    (inside.rows, inside.row_bytes, inside.pitch_bytes),
                    (2 * heads, 9 * size * element, 10 * size * element)
                );
                assert_eq!((pair.slots, pair.element_bytes), (10, element));
                // The new position (slot 9 of `present`) into slot 4 of the same rows.
                let copy = layout.append(pair, 4);
                assert_eq!((copy.from_offset, copy.from_pitch), (9 * size * element, 10 * size * element));
                assert_eq!((copy.to_offset, copy.to_pitch), (4 * size * element, 10 * size * element));
            }
            let cache_bytes = (layout.pairs.len() * 2 * heads * 9 * size * element) as u64;
            // In half types the casts of the cache in and out are gone too.
            let fewer = h.kernels < copied.header.kernels
                || (precision == DType::F32 && h.kernels == copied.header.kernels);
            assert!(
                fewer,
                "{file} {precision}: {} kernels, {} with the copy",
                h.kernels, copied.header.kernels
            );
            assert!(
                h.traffic_bytes + 2 * cache_bytes <= copied.header.traffic_bytes,
                "{file} {precision}: {} bytes moved, {} with the copy",
                h.traffic_bytes,
                copied.header.traffic_bytes
            );
        }
        let prompt = compiled(file, 2, 4, 9, DType::F16, true);
        let layout = CacheLayout::of_prompt(&prompt.header.inputs, &prompt.header.outputs).unwrap();
        assert!(layout.pairs.iter().all(|p| p.slots == 13 && p.element_bytes == 2), "{file}");
        // The unfused baseline too (the exports read `past` through a `Concat` of one input).
        let options = CompileOptions {
            import: ImportOptions::new(specs(file, 2, 1, 9), vec![]),
            precision: DType::F16,
            no_fuse: true,
            cache_in_place: true,
            ..Default::default()
        };
        let unfused = fusec::compile(&common::model_path(file), &options).unwrap();
        let layout = CacheLayout::of(&unfused.header.inputs, &unfused.header.outputs).unwrap();
        assert!(layout.pairs.iter().all(|p| p.slots == 10 && p.element_bytes == 2), "{file} unfused");
    }
}

#[test]
fn a_one_step_bundle_has_a_cache_layout() {
    for file in DECODERS {
        let bundle = step_bundle(file, 2, 9, DType::F32);
        let layout = CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs).unwrap();
        assert_eq!((layout.batch, layout.capacity, layout.vocab), (2, 9, 512), "{file}");
        assert_eq!(layout.logits, "logits");
        assert_eq!(layout.pairs.len(), 4, "{file}");
        let pair = &layout.pairs[1];
        assert_eq!(
            (pair.past.as_str(), pair.present.as_str()),
            ("past_key_values.0.value", "present.0.value")
        );
        // Slot 4 of each (batch, head) row takes the step's last position.
        let (heads, size) = cache_dims(file);
        let copy = layout.append(pair, 4);
        assert_eq!((copy.rows, copy.width), (2 * heads, size * 4));
        assert_eq!((copy.from_offset, copy.from_pitch), (9 * size * 4, 10 * size * 4));
        assert_eq!((copy.to_offset, copy.to_pitch), (4 * size * 4, 9 * size * 4));
    }
    // Not a decoding step: several tokens a step, or no cache at all.
    let prompt = fusec::compile(
        &common::model_path("gpt2_cache_ts.onnx"),
        &CompileOptions {
            import: ImportOptions::new(specs("gpt2_cache_ts.onnx", 1, 4, 3), vec![]),
            ..Default::default()
        },
    )
    .unwrap();
    let err = CacheLayout::of(&prompt.header.inputs, &prompt.header.outputs).unwrap_err();
    assert!(err.contains("input_ids") && err.contains("seq=1"), "{err}");
    let bert = fusec::compile(
        &common::model_path("bert_ts.onnx"),
        &CompileOptions { import: common::shape_variants("bert_ts.onnx").remove(0), ..Default::default() },
    )
    .unwrap();
    let err = CacheLayout::of(&bert.header.inputs, &bert.header.outputs).unwrap_err();
    assert!(err.contains("attention_mask") || err.contains("input_ids"), "{err}");
}

/// The decoding loop itself, its steps run by tract on the CPU: prompts of different lengths
/// in one batch, the cache at a fixed capacity with empty slots masked, each step's keys and
/// values copied into their slot — the same tokens as recomputing every prefix whole.
#[test]
fn the_decoding_loop_on_the_cpu_matches_recomputing_without_a_cache() {
    use fusec::generate::reference::TractSteps;
    let prompts = vec![vec![5i64, 77, 300], vec![11, 2, 480, 9, 160]];
    for file in DECODERS {
        let bundle = step_bundle(file, 2, 10, DType::F32);
        let layout = CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs).unwrap();
        let steps = TractSteps::new(&common::model_path(file), &bundle.header.inputs, &bundle.header.outputs)
            .unwrap();
        let mut generator = fusec::generate::Generator::with_steps(steps, layout);
        let options = GenerateOptions { max_new_tokens: 6, ..Default::default() };
        let generation = generator.generate(&prompts, &options, |_, _| {}).unwrap();
        assert_eq!(generation.steps, 5 + 6 - 1, "{file}");
        // Not one token over and over: the tokens follow what the cache holds.
        let distinct: std::collections::HashSet<_> = generation.tokens.iter().flatten().collect();
        assert!(distinct.len() >= 3, "{file}: {:?}", generation.tokens);
        for (prompt, tokens) in prompts.iter().zip(&generation.tokens) {
            assert_eq!(tokens, &reference_tokens(file, prompt, 6), "{file} after {prompt:?}");
        }
        // A stop token ends its sequence (and is kept); the other goes on.
        let stop = generation.tokens[0][2];
        let options = GenerateOptions { max_new_tokens: 6, stop: Some(stop), ..Default::default() };
        let stopped = generator.generate(&prompts, &options, |_, _| {}).unwrap();
        let first = generation.tokens[0].iter().position(|&t| t == stop).unwrap();
        assert_eq!(stopped.tokens[0], generation.tokens[0][..=first], "{file}");
        let first = generation.tokens[1].iter().position(|&t| t == stop).unwrap_or(5);
        assert_eq!(stopped.tokens[1], generation.tokens[1][..=first], "{file}");
    }
}

#[test]
fn greedy_tokens_match_recomputing_without_a_cache() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (greedy decoding is checked against tract on a GPU machine)");
        return;
    }
    for (file, in_place) in DECODERS.into_iter().flat_map(|f| [(f, false), (f, true)]) {
        // Prompts of different lengths in one batch; 10 new tokens each in a cache of 15.
        let prompts = vec![vec![5i64, 77, 300], vec![11, 2, 480, 9, 160, 33]];
        let bundle = step_bundle(file, 2, 15, DType::F32);
        let mut generator = Generator::new(&compiled(file, 2, 1, 15, DType::F32, in_place), 0).unwrap();
        let options = GenerateOptions { max_new_tokens: 10, ..Default::default() };
        let mut streamed = vec![Vec::new(); 2];
        let generation = generator.generate(&prompts, &options, |b, t| streamed[b].push(t)).unwrap();
        assert_eq!(streamed, generation.tokens, "{file}: the callback sees every token");
        for (prompt, tokens) in prompts.iter().zip(&generation.tokens) {
            assert_eq!(
                tokens,
                &reference_tokens(file, prompt, 10),
                "{file} (in place: {in_place}) after {prompt:?}"
            );
        }
        // Drawn tokens (top-k, one seed) are the CPU loop's.
        let sampled = GenerateOptions {
            max_new_tokens: 8,
            sampling: fusec::generate::Sampling::TopK(20),
            temperature: 0.8,
            seed: 11,
            ..Default::default()
        };
        let ours = generator.generate(&prompts, &sampled, |_, _| {}).unwrap();
        let layout = CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs).unwrap();
        let steps = fusec::generate::reference::TractSteps::new(
            &common::model_path(file),
            &bundle.header.inputs,
            &bundle.header.outputs,
        )
        .unwrap();
        let theirs =
            fusec::generate::Generator::with_steps(steps, layout).generate(&prompts, &sampled, |_, _| {});
        assert_eq!(ours.tokens, theirs.unwrap().tokens, "{file}: top-k draws");
        // A cache too small for the request is an error naming what to change.
        let long = GenerateOptions { max_new_tokens: 40, ..Default::default() };
        let err = generator.generate(&prompts, &long, |_, _| {}).unwrap_err().to_string();
        assert!(err.contains("--dim past"), "{err}");
    }
}

/// Greedy ids fed back on the device (`Session::argmax_feed`) are the ids `argmax_rows` reads
/// back, and a step that reads them from its token input gives the logits it gives with them
/// written from the host; misuse is an error; drawn ids fed back (`Session::sample_feed`) are
/// `sample_rows`'s. A stop token ends a sequence of a batch whose
/// ids are fed back (the generator reads them one step late) exactly where recomputing says.
#[test]
fn fed_tokens_are_the_argmax_and_the_next_steps_input() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (tokens fed back on the device are checked on a GPU machine)");
        return;
    }
    let file = DECODERS[0];
    let (heads, size) = cache_dims(file);
    let mut session = fusec::Session::new(&compiled(file, 2, 1, 15, DType::F32, true), 0).unwrap();
    let ints = |shape: &[usize], v: Vec<i64>| {
        Tensor::from_i64(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap(), DType::I64)
    };
    let mut inputs = vec![
        ("input_ids".to_string(), ints(&[2, 1], vec![5, 300])),
        ("attention_mask".to_string(), ints(&[2, 16], vec![1; 32])),
        ("position_ids".to_string(), ints(&[2, 1], vec![15, 15])),
    ];
    for (k, spec) in specs(file, 2, 1, 15).iter().enumerate().skip(3) {
        let values: Vec<f32> =
            (0..2 * heads * 15 * size).map(|i| ((i * 37 + k * 11) % 101) as f32 / 50.0 - 1.0).collect();
        let shape = IxDyn(&[2, heads, 15, size]);
        inputs.push((spec.name.clone(), Tensor::F32(ArrayD::from_shape_vec(shape, values).unwrap())));
    }
    session.run(&inputs).unwrap();
    let ids = session.argmax_rows("logits", 2, 512).unwrap();
    session.argmax_feed("logits", 2, 512, "input_ids").unwrap();
    assert_eq!(session.fed_tokens().unwrap(), ids);
    session.execute_all().unwrap();
    let fed = session.read_output("logits").unwrap().to_f64_vec();
    session.write_input("input_ids", &ints(&[2, 1], ids.clone())).unwrap();
    session.execute_all().unwrap();
    let written = session.read_output("logits").unwrap().to_f64_vec();
    assert_eq!(fed, written, "the step reading the fed ids ({ids:?})");
    // Misuse: nothing pending, the wrong input, more than two copies in flight.
    assert!(session.fed_tokens().is_err());
    assert!(session.argmax_feed("logits", 2, 512, "attention_mask").is_err());
    session.argmax_feed("logits", 2, 512, "input_ids").unwrap();
    session.argmax_feed("logits", 2, 512, "input_ids").unwrap();
    assert!(session.argmax_feed("logits", 2, 512, "input_ids").is_err());
    assert_eq!(session.fed_tokens().unwrap(), session.fed_tokens().unwrap());
    // Drawn tokens fed back are `sample_rows`'s for the same draws.
    let at = fusec::runtime::SampledRows { rows: 2, width: 512, step: 1, offset: 0 };
    let draw = fusec::runtime::RowDraw::TopK(20);
    let drawn = session.sample_rows("logits", at, draw, 0.8, &[0.3, 0.7]).unwrap();
    session.sample_feed("logits", at, draw, 0.8, &[0.3, 0.7], "input_ids").unwrap();
    assert_eq!(session.fed_tokens().unwrap(), drawn);
    // A stop token: the first sequence's third token.
    let prompts = vec![vec![5i64, 77, 300], vec![11, 2, 480, 9]];
    let references: Vec<Vec<i64>> = prompts.iter().map(|p| reference_tokens(file, p, 10)).collect();
    let stop = references[0][2];
    let expected: Vec<Vec<i64>> = references
        .iter()
        .map(|r| r[..r.iter().position(|&t| t == stop).map_or(r.len(), |k| k + 1)].to_vec())
        .collect();
    let mut generator = Generator::new(&compiled(file, 2, 1, 15, DType::F32, true), 0).unwrap();
    let options = GenerateOptions { max_new_tokens: 10, stop: Some(stop), ..Default::default() };
    let mut streamed = vec![Vec::new(); 2];
    let generation = generator.generate(&prompts, &options, |b, t| streamed[b].push(t)).unwrap();
    assert_eq!(generation.tokens, expected, "stop token {stop}");
    assert_eq!(streamed, expected, "the callback sees the tokens kept, no more");
}

/// On the GPU, a prompt step (two sessions: the cache filled across them on the device) gives
/// the greedy tokens of recomputing every prefix, and top-k draws equal to the CPU loop's.
#[test]
fn a_prompt_step_on_the_gpu_gives_the_same_tokens() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the prompt step is checked against tract on a GPU machine)");
        return;
    }
    for (file, in_place) in DECODERS.into_iter().flat_map(|f| [(f, false), (f, true)]) {
        let prompts = vec![vec![5i64, 77, 300, 41], vec![11, 2, 480, 9, 160, 33]];
        let step = step_bundle(file, 2, 15, DType::F32);
        // The prompt step after a cache of the one-token step's capacity, or of one position
        // (as `fusec generate` compiles it).
        let prompt = compiled(file, 2, 4, if in_place { 1 } else { 15 }, DType::F32, in_place);
        let mut generator =
            Generator::with_prompt(&compiled(file, 2, 1, 15, DType::F32, in_place), &prompt, 0).unwrap();
        let options = GenerateOptions { max_new_tokens: 10, ..Default::default() };
        let generation = generator.generate(&prompts, &options, |_, _| {}).unwrap();
        assert_eq!(generation.steps, 1 + 6 + 10 - 1 - 4, "{file}");
        for (p, tokens) in prompts.iter().zip(&generation.tokens) {
            assert_eq!(tokens, &reference_tokens(file, p, 10), "{file} (in place: {in_place}) after {p:?}");
        }
        let sampled = GenerateOptions {
            max_new_tokens: 8,
            sampling: fusec::generate::Sampling::TopK(20),
            temperature: 0.8,
            seed: 5,
            ..Default::default()
        };
        let ours = generator.generate(&prompts, &sampled, |_, _| {}).unwrap();
        let layout = CacheLayout::of(&step.header.inputs, &step.header.outputs).unwrap();
        let steps = fusec::generate::reference::TractSteps::new(
            &common::model_path(file),
            &step.header.inputs,
            &step.header.outputs,
        )
        .unwrap();
        let theirs =
            fusec::generate::Generator::with_steps(steps, layout).generate(&prompts, &sampled, |_, _| {});
        assert_eq!(ours.tokens, theirs.unwrap().tokens, "{file}: top-k draws after a prompt step");
    }
}

/// A step with its cache in place, run on inputs given in full (random cached keys and
/// values written into the rows inside `present`): every output matches tract's on the ONNX
/// file (fp32); in fp16, decoding gives the tokens of the build that copies the cache (which
/// rounds the same values to fp16 on the way in).
#[test]
fn a_cache_in_place_matches_tract_and_the_copy() {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the cache in place is checked against tract on a GPU machine)");
        return;
    }
    for file in DECODERS {
        let (batch, past) = (3, 7);
        let bundle = compiled(file, batch, 1, past, DType::F32, true);
        let inputs = one_token_inputs(file, 3, past, &vec![1; batch * (past + 1)], past as f64, 7);
        let values: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
        step_matches_tract(&bundle, file, &inputs, &values, 1e-5, file);
        let prompts = vec![vec![5i64, 77, 300], vec![11, 2, 480, 9, 160, 33]];
        let options = GenerateOptions { max_new_tokens: 10, ..Default::default() };
        let tokens = |in_place| {
            let mut generator = Generator::new(&compiled(file, 2, 1, 15, DType::F16, in_place), 0).unwrap();
            generator.generate(&prompts, &options, |_, _| {}).unwrap().tokens
        };
        assert_eq!(tokens(true), tokens(false), "{file}: fp16, in place against the copy");
    }
}

/// A one-token step in half types (the cache stored in them) runs its attention in the decoding kernel (one query row a
/// batch × head, the keys that weigh anything found from the mask and split over a cluster's
/// blocks; for GPT-2 the batch's kernel with the projection inside, `codegen::attention::rows`): its logits and presents agree with tract, at caches of 7 and 300 positions, for
/// three sequences whose masks differ — all positions live, empty slots at the end (a cache
/// not yet full), and zeros at the start too (a shorter prompt padded on the left).
#[test]
fn one_query_attention_matches_tract_in_half_types() {
    let cases = [(DType::F16, 7usize), (DType::BF16, 300), (DType::F16, 300)];
    for file in DECODERS {
        for (precision, past) in cases {
            let batch = 3;
            let bundle = compiled(file, batch, 1, past, precision, true);
            let decoding = bundle.header.steps.iter().any(|s| match s {
                fusec::codegen::Step::Launch(k) => {
                    k.source.contains("Attention of one query row") || k.source.contains("A decoding step of")
                }
                _ => false,
            });
            assert!(decoding, "{file} {precision}: no decoding attention kernel in the step");
            // Its mask is the model's input, which no kernel writes: looked through before the
            // kernel waits for the one before it.
            let mut early = 0;
            for step in &bundle.header.steps {
                let fusec::codegen::Step::Launch(k) = step else { continue };
                if let (Some(scan), Some(wait)) =
                    (k.source.find("hi = lst + 1;"), k.source.find("fusec::grid_begin();"))
                {
                    assert!(scan < wait, "{file} {precision}: the mask scan after the wait in {}", k.name);
                    early += 1;
                }
            }
            assert!(early > 0, "{file} {precision}: no decoding kernel scans its mask");
            if !fusec::runtime::driver_available() {
                continue;
            }
            let total = past + 1;
            let mask: Vec<i64> = (0..batch * total)
                .map(|i| {
                    let (b, t) = (i / total, i % total);
                    let live = match b {
                        0 => true,
                        1 => t < past / 2 || t == past,
                        _ => (t >= 3 && t < past - past / 3) || t == past,
                    };
                    i64::from(live)
                })
                .collect();
            // The cache goes in in the half type; tract takes the same values, rounded, in f32.
            let (inputs, values) =
                common::in_bundle_types(&bundle, one_token_inputs(file, 3, past, &mask, 5.0, 40));
            step_matches_tract(
                &bundle,
                file,
                &inputs,
                &values,
                1e-2,
                &format!("{file} {precision} past {past}"),
            );
        }
    }
}

/// Text prompts through a tokenizer file, decoded back: the fixture's word-level tokenizer
/// (`models/make_tokenizer.py`) round-trips words, maps unknown ones to `[UNK]`, and a prompt
/// given as text decodes on the CPU loop into the same tokens as its ids.
#[test]
fn text_prompts_go_through_the_tokenizer() {
    use fusec::generate::{reference::TractSteps, TextCodec};
    let codec = TextCodec::load(&common::model_path("tokenizer_words.json")).unwrap();
    let ids = codec.encode("The cat sat, on the mat!").unwrap();
    assert_eq!(ids.len(), 8, "{ids:?}");
    assert_eq!(ids[0], ids[5], "'The' and 'the' are one token after lowercasing: {ids:?}");
    assert_eq!(ids[6], 0, "'mat' is not in the vocabulary: [UNK]");
    assert_eq!(codec.decode(&ids).unwrap(), "the cat sat , on the !", "[UNK] is special: left out");
    let err = codec.decode(&[3, 512]).unwrap_err().to_string();
    assert!(err.contains("token id 512 is outside the tokenizer's vocabulary of 512"), "{err}");
    let err = TextCodec::load(Path::new("no/such/tokenizer.json")).err().unwrap().to_string();
    assert!(err.contains("no/such/tokenizer.json"), "{err}");

    let file = DECODERS[0];
    let bundle = step_bundle(file, 1, 8, DType::F32);
    let layout = CacheLayout::of(&bundle.header.inputs, &bundle.header.outputs).unwrap();
    let steps =
        TractSteps::new(&common::model_path(file), &bundle.header.inputs, &bundle.header.outputs).unwrap();
    let mut generator = fusec::generate::Generator::with_steps(steps, layout);
    let prompt = codec.encode("a big red dog").unwrap();
    let options = GenerateOptions { max_new_tokens: 4, ..Default::default() };
    let generation = generator.generate(std::slice::from_ref(&prompt), &options, |_, _| {}).unwrap();
    assert_eq!(generation.tokens[0], reference_tokens(file, &prompt, 4));
    let text = codec.decode(&generation.tokens[0]).unwrap();
    assert!(!text.is_empty() && text.split(' ').count() <= 4, "{text:?}");
}

/// A prompt step (the first 3 tokens of every prompt in one step, its keys and values copied
/// into the one-token step's cache) gives the same tokens as the prompts token by token and as
/// recomputing every prefix; a prompt step longer than the shortest prompt is not used.
#[test]
fn a_prompt_step_gives_the_same_tokens_on_the_cpu() {
    use fusec::generate::reference::TractSteps;
    let prompts = vec![vec![5i64, 77, 300], vec![11, 2, 480, 9, 160]];
    for file in DECODERS {
        let path = common::model_path(file);
        let step = step_bundle(file, 2, 10, DType::F32);
        let layout = CacheLayout::of(&step.header.inputs, &step.header.outputs).unwrap();
        let options = GenerateOptions { max_new_tokens: 6, ..Default::default() };
        // Prompt steps after a cache of the one-token step's capacity, and of one position.
        for (p, used, cache) in [(3, true, 10), (2, true, 10), (4, false, 10), (3, true, 1), (2, true, 1)] {
            let prompt = prompt_bundle(file, 2, p, cache, DType::F32);
            let prompt_layout =
                CacheLayout::of_prompt(&prompt.header.inputs, &prompt.header.outputs).unwrap();
            assert_eq!(prompt_layout.seq, p);
            assert!(CacheLayout::of(&prompt.header.inputs, &prompt.header.outputs).is_err());
            let steps = TractSteps::new(&path, &step.header.inputs, &step.header.outputs).unwrap();
            let prompt_steps = TractSteps::new(&path, &prompt.header.inputs, &prompt.header.outputs).unwrap();
            let mut generator = fusec::generate::Generator::with_steps(steps, layout.clone())
                .with_prompt_steps(prompt_steps, prompt_layout)
                .unwrap();
            assert_eq!(generator.prompt_length(), Some(p));
            let generation = generator.generate(&prompts, &options, |_, _| {}).unwrap();
            let expected_steps = if used { 1 + (5 + 6 - 1 - p) } else { 5 + 6 - 1 };
            assert_eq!(generation.steps, expected_steps, "{file}, prompt step of {p} after {cache}");
            for (prompt, tokens) in prompts.iter().zip(&generation.tokens) {
                assert_eq!(
                    tokens,
                    &reference_tokens(file, prompt, 6),
                    "{file}, prompt step of {p} (cache {cache}), after {prompt:?}"
                );
            }
        }
        // A prompt step of another batch does not fit.
        let other = prompt_bundle(file, 1, 3, 10, DType::F32);
        let other_layout = CacheLayout::of_prompt(&other.header.inputs, &other.header.outputs).unwrap();
        let steps = TractSteps::new(&path, &step.header.inputs, &step.header.outputs).unwrap();
        let other_steps = TractSteps::new(&path, &other.header.inputs, &other.header.outputs).unwrap();
        let err = fusec::generate::Generator::with_steps(steps, layout.clone())
            .with_prompt_steps(other_steps, other_layout)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("does not match the one-token step"), "{err}");
    }
}

/// A cache of 2,000 positions filled one token at a time does not drift: the last step's
/// logits (the cache holding 1,999 positions computed step by step) against tract's forward
/// pass over the whole sequence at once, fp32 (the Llama-style fixture: rotary positions, no
/// table of 64 as the tiny GPT-2 has).
#[test]
fn a_cache_of_2000_tokens_does_not_drift() {
    drift_over_2000_tokens(DType::F32, 1e-5);
}

/// The same in fp16 (against tract's f32): its attention is the tensor-core kernel, whose
/// one query a step over the 2,000 positions is split over a cluster of blocks.
#[test]
fn a_cache_of_2000_tokens_does_not_drift_in_fp16() {
    drift_over_2000_tokens(DType::F16, 1e-2);
}

fn drift_over_2000_tokens(precision: DType, tolerance: f64) {
    if !fusec::runtime::driver_available() {
        println!("skipped: no CUDA driver (the 2,000-token cache is checked against tract on a GPU machine)");
        return;
    }
    let file = "llama_cache_ts.onnx";
    let n = 2000;
    let mut state = 12345u64;
    let prompt: Vec<i64> = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            1 + (state >> 33) as i64 % 511
        })
        .collect();
    let step = step_bundle(file, 1, n, precision);
    let mut generator = Generator::new(&step, 0).unwrap();
    let options = GenerateOptions { max_new_tokens: 1, ..Default::default() };
    let generation = generator.generate(std::slice::from_ref(&prompt), &options, |_, _| {}).unwrap();
    assert_eq!(generation.steps, n);
    let ours = fusec::generate::Steps::read_output(generator.steps_mut(), "logits").unwrap();

    let all = common::decoders::whole_sequence_logits(file, &prompt);
    let last: Vec<f32> = all[(n - 1) * 512..n * 512].iter().map(|&v| v as f32).collect();
    let theirs = Tensor::from_f64(
        ArrayD::from_shape_vec(IxDyn(&[1, 1, 512]), last.iter().map(|&v| f64::from(v)).collect()).unwrap(),
        DType::F32,
    );
    let error = fusec::ir::rel_l2(&ours, &theirs);
    println!("2,000-token cache ({precision:?}): the last step's logits against the whole sequence, rel-L2 {error:.2e}");
    assert!(error <= tolerance, "{precision:?}: rel-L2 {error:.2e}");
}

/// The programs `fusec generate` compiles — one-token steps and 4-token prompt steps, their
/// cache in place (`present = Concat(past, new)` an append inside `present`'s buffer, no
/// Concat of the cache left) — planned after 1, 17 and 300 cached positions and evaluated on
/// the CPU (the reference evaluator, on the planned graph) agree with tract on the ONNX file.
#[test]
fn cache_in_place_programs_at_several_cache_lengths_match_tract() {
    for file in DECODERS {
        let path = common::model_path(file);
        for (seq, past) in [(1, 1), (1, 17), (1, 300), (4, 1), (4, 17)] {
            let options = CompileOptions {
                import: ImportOptions::new(specs(file, 2, seq, past), vec![]),
                cache_in_place: true,
                ..Default::default()
            };
            let (plan, _) = fusec::pipeline::plan_reporting(&path, &options, &mut |_| {})
                .unwrap_or_else(|e| panic!("{e}"));
            // An append for each cached tensor, and no Concat reading the cache.
            let g = &plan.graph;
            let appends =
                g.node_ids().filter(|&id| matches!(g.node(id).op, fusec::ir::Op::Append { .. })).count();
            assert_eq!(appends, 4, "{file} {seq} after {past}: {:?}", g.op_histogram());
            let cache: Vec<_> =
                plan.inputs.iter().filter(|b| b.name.starts_with("past")).map(|b| b.value).collect();
            let concat_of_cache = g.node_ids().any(|id| {
                matches!(g.node(id).op, fusec::ir::Op::Concat { .. })
                    && g.inputs_of(id).iter().any(|i| cache.contains(i))
            });
            assert!(!concat_of_cache, "{file} {seq} after {past}: a Concat of the cache is left");
            let model = fusec::import::import(&path, &options.import).unwrap_or_else(|e| panic!("{e}"));
            let inputs = common::random_inputs(&model, 7 + past as u64);
            let feeds: std::collections::HashMap<_, _> = inputs.iter().cloned().collect();
            // The planned graph with its constants back from the weights it placed them in.
            let mut graph = plan.graph.clone();
            for id in graph.node_ids().collect::<Vec<_>>() {
                let value = plan.constant_value(id);
                if let (fusec::ir::Op::Constant(c), Some(v)) = (&mut graph.node_mut(id).op, value) {
                    *c = std::sync::Arc::new(v);
                }
            }
            let ours = fusec::ir::evaluate(&graph, &feeds).unwrap_or_else(|e| panic!("{file}: {e}"));
            let values: Vec<Tensor> = inputs.into_iter().map(|(_, t)| t).collect();
            let theirs = run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(ours.len(), theirs.len(), "{file}");
            for ((name, a), t) in ours.iter().zip(&theirs) {
                let err = fusec::ir::rel_l2(a, t);
                assert!(err <= 1e-5, "{file} {seq} tokens after {past}: {name} rel-L2 {err:e}");
            }
        }
    }
}

/// In a one-token step of a half type with its cache in place, the decoding attention kernel
/// requests its first keys and values from the cache (which no kernel of the step writes
/// before it) before it lets the next kernel be scheduled and waits for the one before it; the
/// query, the new key and value (which that kernel writes) and those keys' mask values (which
/// would hold up the next kernel's scheduling, were they converted before it) are read after.
/// Checked in the PTX NVRTC makes of it.
#[test]
fn decoding_attention_reads_its_first_keys_before_it_waits() {
    if !fusec::nvrtc::available() {
        println!("skipped: NVRTC not found");
        return;
    }
    for file in DECODERS {
        let bundle = compiled(file, 1, 1, 64, DType::F16, true);
        let kernel = bundle
            .header
            .steps
            .iter()
            .flat_map(|s| s.sources())
            .find(|k| k.source.contains("Attention of one query row"))
            .unwrap_or_else(|| panic!("{file}: no decoding attention kernel"));
        let mut inlined = kernel.clone();
        inlined.source = fusec::nvrtc::source_with_header(kernel, false);
        let ptx = fusec::nvrtc::compile(&inlined, "sm_90").unwrap_or_else(|e| panic!("{file}: {e}"));
        let at = |needle: &str| ptx.find(needle).unwrap_or_else(|| panic!("{file}: no {needle} in the PTX"));
        let (trigger, wait) = (at("griddepcontrol.launch_dependents"), at("griddepcontrol.wait"));
        assert!(trigger < wait, "{file}: the trigger after the wait");
        // The cache's rows: 16-byte loads through the pointer the new row is stored with (not
        // the read-only path), four keys and four values a lane, and nothing read between them
        // and the trigger.
        let first_row = at("ld.global.v4.u32");
        let rows_before = ptx[..trigger].matches("ld.global.v4.u32").count();
        assert!(rows_before >= 8, "{file}: {rows_before} cache loads before the trigger");
        // Where the kernel computes its Q, K and V projection (GPT-2 at one sequence,
        // `tests/attention_qkv.rs`), the projection's weights are read before the wait too
        // (read-only: no kernel writes them), and its input row after it.
        let projects = kernel.source.contains("the projection's kernel joined this one");
        let before: Vec<&str> = ptx[..wait].lines().filter(|l| l.contains("ld.global.nc")).collect();
        if projects {
            assert!(
                before.iter().any(|l| l.contains("ld.global.nc.v4")),
                "{file}: no weights before the wait"
            );
        } else {
            let between: Vec<&str> =
                ptx[first_row..wait].lines().filter(|l| l.contains("ld.global.nc")).collect();
            assert!(
                between.is_empty(),
                "{file}: read-only loads between the cache's and the wait: {between:?}"
            );
            // Before them only the mask's scan reads memory (8-byte mask values).
            let scan: Vec<&str> = ptx[..first_row].lines().filter(|l| l.contains("ld.global")).collect();
            assert!(scan.iter().all(|l| l.contains("ld.global.nc.u64")), "{file}: {scan:?}");
        }
        assert!(ptx[wait..].contains("ld.global.nc"), "{file}: no query (or input row) read after the wait");
    }
}
