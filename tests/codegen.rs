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
    out.extend(attention_programs());
    for file in common::all_fixtures() {
        for precision in [DType::F16, DType::BF16] {
            // A decoder with a cache (a one-token step) also as `fusec generate` compiles it: the
            // cache appended in place, by the attention kernel.
            let places: &[bool] = if common::has_cache(&file) { &[false, true] } else { &[false] };
            for &cache_in_place in places {
                let import = common::shape_variants(&file).remove(0);
                let options =
                    fusec::CompileOptions { import, precision, cache_in_place, ..Default::default() };
                let bundle = fusec::compile(&common::model_path(&file), &options)
                    .unwrap_or_else(|e| panic!("{file} {precision}: {e}"));
                let place = if cache_in_place { " cache in place" } else { "" };
                out.push((format!("{file} {precision}{place}"), true, bundle.header.steps));
            }
        }
    }
    out
}

/// Attention alone at the suite's shapes (batch 8, 12 heads): keys × depth of BERT-base and
/// GPT-2 (128 × 64), a ViT (197 × 64), wide and odd heads, in f32 and both half types; the
/// tiling (one buffer for up to 128 keys, two deep beyond; threads per query row in f32)
/// changes with them.
fn attention_programs() -> Vec<(String, bool, Vec<Step>)> {
    use fusec::ir::{Graph, Op, Origin, TensorType};
    let mut out = Vec::new();
    for (keys, depth) in [(128, 64), (197, 64), (128, 128), (77, 80), (512, 64), (13, 20)] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let origin = |n: &str| Origin::new(n, "test");
            let mut g = Graph::new();
            let q = g.add_input("q", TensorType::new(dtype, vec![8, 12, keys, depth]));
            let kt = g.add_input("kt", TensorType::new(dtype, vec![8, 12, depth, keys]));
            let v = g.add_input("v", TensorType::new(dtype, vec![8, 12, keys, depth]));
            let op = Op::Attention { scale: 0.125, nan_to_zero: false };
            let y = g.add_op(op, &[q, kt, v], "y", origin("y")).unwrap();
            g.set_outputs(vec![("y".into(), y)]);
            let part = partition(&g, &HashMap::new(), Mode::Fused).unwrap();
            let plan = Plan::new(g, part).unwrap();
            let steps = codegen::generate(&plan).unwrap();
            out.push((format!("attention {keys}x{depth} {dtype}"), true, steps));
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
        for (is_fused, mut graph, mut covers, mode) in [
            (true, fused.graph.clone(), fused.covers.clone(), Mode::Fused),
            (false, model.graph.clone(), HashMap::new(), Mode::OneKernelPerNode),
        ] {
            // As compilation does: each attention node computes its own mask.
            if is_fused {
                fusec::passes::own_attention_masks(&mut graph, &mut covers).unwrap();
            }
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
    if !fusec::nvrtc::available() {
        println!("skipped: NVRTC not found (set LD_LIBRARY_PATH to a CUDA 13 lib/ with libnvrtc.so.13)");
        return;
    }
    assert!(
        fusec::nvrtc::cuda_include_dir().is_some(),
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
            println!("{file} fused={fused}: {}", source.name);
            compiled += 1;
            checked += usize::from(common::compiles_without_spills(source, ptxas.as_deref(), dir.path()));
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
    if !fusec::nvrtc::available() {
        println!("skipped: NVRTC not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("FUSEC_CACHE_DIR", dir.path());
    let (_, _, steps) = programs().into_iter().find(|(f, fused, _)| f == "mlp_block.onnx" && *fused).unwrap();
    let source = steps.iter().flat_map(|s| s.sources()).next().unwrap().clone();
    let first = fusec::nvrtc::compile_cached(&source, "sm_90").unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1);
    let again = fusec::nvrtc::compile_cached(&source, "sm_90").unwrap();
    assert_eq!(first, again);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    let other_arch = fusec::nvrtc::compile_cached(&source, "sm_80").unwrap();
    assert_ne!(other_arch, first);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    // An entry cut short, another kernel's PTX under this key, or one changed byte of the PTX
    // (a constant of an instruction) is compiled again and replaced, never loaded.
    let entry = files[0].as_ref().unwrap().path();
    let whole = std::fs::read_to_string(&entry).unwrap();
    let ptx_end = whole.rfind("// fusec nvrtc cache entry").unwrap();
    let mut flipped = whole.clone().into_bytes();
    let digit = flipped[..ptx_end].iter().rposition(|b| (b'0'..=b'8').contains(b)).unwrap();
    flipped[digit] += 1;
    let flipped = String::from_utf8(flipped).unwrap();
    for bad in [whole[..whole.len() / 2].to_string(), whole.replace(&source.function, "fusec_other"), flipped]
    {
        std::fs::write(&entry, bad).unwrap();
        assert_eq!(fusec::nvrtc::compile_cached(&source, "sm_90").unwrap(), first);
        assert_eq!(std::fs::read_to_string(&entry).unwrap(), whole);
    }
}

/// A generated kernel lets the next one be scheduled (programmatic dependent launch) before it
/// waits for the one before, so that the next one's launch and first reads overlap this one;
/// with the order measured against it (`FUSEC_PDL_EARLY_TRIGGER=0`), after the wait.
#[test]
fn kernels_let_the_next_be_scheduled_before_they_wait() {
    if !fusec::nvrtc::available() {
        println!("skipped: NVRTC not found");
        return;
    }
    let (_, _, steps) = programs().into_iter().find(|(f, fused, _)| f == "mlp_block.onnx" && *fused).unwrap();
    let source = steps
        .iter()
        .flat_map(|s| s.sources())
        .find(|s| s.source.contains("fusec::grid_begin();"))
        .expect("a kernel that waits for the one before")
        .clone();
    for after in [false, true] {
        let mut inlined = source.clone();
        inlined.source = fusec::nvrtc::source_with_header(&source, after);
        let ptx = fusec::nvrtc::compile(&inlined, "sm_90").unwrap();
        let trigger = ptx.find("griddepcontrol.launch_dependents").expect("a trigger in the PTX");
        let wait = ptx.find("griddepcontrol.wait").expect("a wait in the PTX");
        assert_eq!(trigger > wait, after, "{}: trigger at {trigger}, wait at {wait}", source.name);
    }
    assert_eq!(fusec::nvrtc::full_source(&source), fusec::nvrtc::source_with_header(&source, false));
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
            if let Step::Gemm { gemm, epilogue: Some(kernel), .. } = step {
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

/// Pointwise kernels and GEMM epilogues whose last axis splits into 16-byte packs read and write them with
/// vector accesses; a last axis that does not split keeps one element per thread.
#[test]
fn pointwise_kernels_use_packs_where_the_last_axis_splits() {
    let kernels = |file: &str, precision: DType| {
        let import = common::shape_variants(file).remove(0);
        let options = fusec::CompileOptions { import, precision, ..Default::default() };
        let bundle = fusec::compile(&common::model_path(file), &options).unwrap();
        bundle.header.steps.iter().flat_map(|s| s.sources().cloned().collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    // Erf-GELU over 24 columns: packs of 4 in f32, of 8 in f16.
    let f32 = kernels("gelu_erf_div.onnx", DType::F32);
    let pointwise = f32.iter().find(|k| k.name.contains("pointwise")).expect("a pointwise kernel");
    assert!(pointwise.source.contains("fusec::Pack<float, 4>"), "{}", pointwise.source);
    assert!(pointwise.source.contains("for (int j = 0; j < 4; ++j)"), "{}", pointwise.source);
    // The f16 MLP's GEMM epilogues over 40 columns: packs of 8 halves.
    let f16 = kernels("mlp_block.onnx", DType::F16);
    assert!(f16.iter().any(|k| k.name.contains("gemm") && k.source.contains("fusec::Pack<__half, 8>")));
    // op_coverage's unary chain runs over [2, 3, 11]: 11 does not split.
    let odd = kernels("op_coverage.onnx", DType::F32);
    let over_x: Vec<_> = odd.iter().filter(|k| k.source.contains("if (i >= 66)")).collect();
    assert!(!over_x.is_empty(), "a kernel over the 66 elements of x");
    assert!(over_x.iter().all(|k| !k.source.contains("fusec::Pack")));
}

/// bf16 keeps a transformer's residual stream in f32: LayerNorm kernels read and write f32
/// and also write the bf16 copy the next GEMM reads, in the same kernel.
#[test]
fn bf16_keeps_the_residual_stream_in_f32() {
    let import = common::shape_variants("bert_ts.onnx").remove(0);
    let options = fusec::CompileOptions { import, precision: DType::BF16, ..Default::default() };
    let bundle = fusec::compile(&common::model_path("bert_ts.onnx"), &options).unwrap();
    let f16 = fusec::compile(
        &common::model_path("bert_ts.onnx"),
        &fusec::CompileOptions { precision: DType::F16, ..options.clone() },
    )
    .unwrap();
    assert_eq!(bundle.header.steps.len(), f16.header.steps.len(), "the casts join existing kernels");
    let norms: Vec<_> = bundle
        .header
        .steps
        .iter()
        .flat_map(|s| s.sources())
        .filter(|k| k.name.contains("layernorm"))
        .collect();
    assert!(!norms.is_empty());
    for k in &norms {
        assert!(k.source.contains("float* __restrict__ out"), "{}: no f32 output\n{}", k.name, k.source);
    }
    assert!(norms.iter().any(|k| k.source.contains("__nv_bfloat16* __restrict__ out")));
    for step in &bundle.header.steps {
        if let Step::Gemm { gemm, .. } = step {
            assert_eq!(gemm.dtype, DType::BF16, "GEMMs stay bf16");
        }
    }
}

/// A rotate-half reads its input at other elements, so it must never share a kernel with the
/// op computing that input; the rotation `x·cos + rotate_half(x)·sin` of a stored `x` is one
/// kernel, and both partitions generate code.
#[test]
fn rotate_half_reads_its_input_from_memory() {
    use fusec::ir::{BinaryOp, Graph, Op, Origin, TensorType, UnaryOp};
    use std::sync::Arc;
    let origin = |n: &str| Origin::new(n, "test");
    let ty = TensorType::new(DType::F32, vec![2, 3, 8]);
    let mut g = Graph::new();
    let x = g.add_input("x", ty.clone());
    let cos = g.add_constant("cos", Arc::new(fusec::ir::random_tensor(&ty, 1, -1.0, 1.0)), origin("cos"));
    let sin = g.add_constant("sin", Arc::new(fusec::ir::random_tensor(&ty, 2, -1.0, 1.0)), origin("sin"));
    // Stored x: the rotation of x is one kernel.
    let a = g.add_op(Op::Binary(BinaryOp::Mul), &[x, cos], "a", origin("a")).unwrap();
    let r = g.add_op(Op::RotateHalf, &[x], "r", origin("r")).unwrap();
    let b = g.add_op(Op::Binary(BinaryOp::Mul), &[r, sin], "b", origin("b")).unwrap();
    let y = g.add_op(Op::Binary(BinaryOp::Add), &[a, b], "y", origin("y")).unwrap();
    // x computed by a pointwise op: its rotate-half must be in another kernel.
    let t = g.add_op(Op::Unary(UnaryOp::Tanh), &[y], "t", origin("t")).unwrap();
    let rt = g.add_op(Op::RotateHalf, &[t], "rt", origin("rt")).unwrap();
    let z = g.add_op(Op::Binary(BinaryOp::Mul), &[rt, t], "z", origin("z")).unwrap();
    g.set_outputs(vec![("z".into(), z)]);
    let part = partition(&g, &HashMap::new(), Mode::Fused).unwrap();
    let kernel_of = |n| part.kernels.iter().position(|k| k.nodes.contains(&n)).unwrap();
    assert!([a, r, b, y].iter().all(|&n| kernel_of(n) == kernel_of(y)), "{:?}", part.kernels);
    assert_ne!(kernel_of(rt), kernel_of(t), "{:?}", part.kernels);
    let plan = Plan::new(g, part).unwrap();
    let steps = codegen::generate(&plan).unwrap();
    let sources: Vec<_> = steps.iter().flat_map(|s| s.sources()).collect();
    assert_eq!(sources.len(), 2, "the rotation, then tanh and its rotate-half product");
    // The swapped read and the sign, in each kernel.
    for k in &sources {
        assert!(k.source.contains("< 4) ? -(") || k.source.contains("< 4LL) ? -("), "{}", k.source);
    }
    if fusec::nvrtc::available() {
        for k in sources {
            fusec::nvrtc::compile(k, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        }
    } else {
        println!("NVRTC not found: the rotate-half kernels were generated but not compiled");
    }
}

/// The kernels of identical layers run one function: their sources are the same once the
/// memory they touch is a parameter. Every step naming a function carries that function's
/// source. (Their arguments may be the same too: the arena gives each layer's activations the
/// buffers the layer before freed, and the layers' folded masks are one constant.)
#[test]
fn identical_layers_share_one_function() {
    for (file, dims) in
        [("bert12_ts.onnx", [("batch", 2), ("seq", 9)]), ("gpt2_ts.onnx", [("batch", 3), ("seq", 7)])]
    {
        let mut import = fusec::import::ImportOptions::default();
        for (name, value) in dims {
            import.dims.insert(name.into(), value);
        }
        let options = fusec::CompileOptions { import, precision: DType::F16, ..Default::default() };
        let bundle = fusec::compile(&common::model_path(file), &options).unwrap();
        let sources: Vec<_> = bundle.header.steps.iter().flat_map(|s| s.sources()).collect();
        let mut functions: HashMap<&str, Vec<&fusec::codegen::KernelSource>> = HashMap::new();
        for s in &sources {
            assert!(
                s.source.contains(&format!(" {}(", s.function)),
                "{file}: {} is not in its source",
                s.function
            );
            functions.entry(&s.function).or_default().push(s);
        }
        for (function, steps) in &functions {
            assert!(steps.iter().all(|s| s.source == steps[0].source), "{file}: {function} has two sources");
        }
        // The kernels for a few rows (18 rows here: the tensor-core kernel) are one a GEMM
        // shape, counted apart.
        let few_rows: std::collections::HashSet<&str> = bundle
            .header
            .steps
            .iter()
            .filter_map(|s| match s {
                fusec::codegen::Step::Gemm { skinny: Some(k), .. } => Some(k.function.as_str()),
                _ => None,
            })
            .collect();
        println!(
            "{file}: {} kernel launches, {} functions ({} for a few rows)",
            sources.len(),
            functions.len(),
            few_rows.len()
        );
        if file == "bert12_ts.onnx" {
            // 12 layers: embeddings, then per layer the same handful of kernels; a kernel for
            // a few rows for each of a layer's four GEMM shapes and the head's.
            assert!(
                sources.len() >= 60 && functions.len() - few_rows.len() <= 12 && few_rows.len() <= 6,
                "{} sources, {} functions, {} for a few rows",
                sources.len(),
                functions.len(),
                few_rows.len()
            );
        }
    }
}

/// The masked exports' attention kernels evaluate the mask from the `[b, k]` input at each
/// score (`mask_at`), in f32 and in half types (the two templates); GPT-2's causal matrix is a
/// comparison of the coordinates, BERT's all-true one and the `where`'s scalars literals, so
/// the one load a score is of the input.
#[test]
fn attention_kernels_evaluate_padding_masks() {
    for (file, fused, steps) in programs() {
        if !fused || !file.contains("_mask_") {
            continue;
        }
        let attention: Vec<_> =
            steps.iter().flat_map(|s| s.sources()).filter(|s| s.name.contains("attention")).collect();
        assert!(!attention.is_empty(), "{file}");
        for source in attention {
            let text = &source.source;
            let lambda = text
                .lines()
                .find(|l| l.contains("auto mask_at = "))
                .unwrap_or_else(|| panic!("{file}: {text}"));
            assert!(text.contains("mask_at(s, t)"), "{file}");
            // Buffer parameters are `in<N>`: a load is `in<N>[`.
            let loads = lambda
                .match_indices("in")
                .filter(|(at, _)| {
                    let rest = &lambda[at + 2..];
                    let digits = rest.chars().take_while(char::is_ascii_digit).count();
                    digits > 0 && rest[digits..].starts_with('[')
                })
                .count();
            assert_eq!(loads, 1, "{file}: {lambda}");
            assert_eq!(lambda.contains("(t) - (s) <= 0LL"), file.starts_with("gpt2"), "{file}: {lambda}");
        }
    }
}

/// Attention whose mask is a constant causal matrix (the exports of GPT-2 and Llama without a
/// mask input) skips the key tiles past each block's last query row; attention with no such
/// mask (BERT, ViT), or a mask computed from an input (the masked exports), skips none.
#[test]
fn causal_attention_skips_the_tiles_past_the_diagonal() {
    for (file, fused, steps) in programs() {
        if !fused || !file.ends_with(".onnx") && !file.contains(".onnx ") {
            continue;
        }
        // Decoders with a cache read their padding mask, and queries sit after the cached
        // keys: no tile is past a diagonal.
        let causal = (file.starts_with("gpt2") || file.starts_with("llama"))
            && !file.contains("_mask_")
            && !common::has_cache(&file);
        for source in steps.iter().flat_map(|s| s.sources()).filter(|s| s.name.contains("attention")) {
            assert_eq!(source.source.contains("The mask is causal"), causal, "{file} {}", source.name);
        }
    }
}
