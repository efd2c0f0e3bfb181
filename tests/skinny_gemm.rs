//! Products of a few rows (a decoding step's GEMMs) get fusec's own kernel beside the library
//! call: an MLP of two MatMuls (a bias and ReLU after the first, the residual after the second;
//! weights stored `[K, N]`) and a head through `Gemm` with `transB` (weights `[N, K]`, an odd
//! width), at 3 and 4 rows (more take the tensor-core kernel in half types), awkward sizes.
//! Every kernel through NVRTC (through ptxas too where it is found: no spills), none for 9
//! rows in f32 (tens of rows in half types: the tensor-core kernel); on a GPU, the bundle with
//! the kernels forced (`FUSEC_SKINNY=1`) and with them chosen by timing, against tract.

mod common;

use std::path::{Path, PathBuf};

use common::onnx::{int, node, weight, write_model};
use fusec::codegen::{KernelSource, Step};
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;

/// `rows` rows of `width` through an `inner`-wide MLP with a residual, then a `head`-wide
/// head.
fn mlp(dir: &Path, rows: i64, [width, inner, head]: [i64; 3]) -> PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "w1"], "m1", vec![]),
        node("Add", &["m1", "b1"], "a1", vec![]),
        node("Relu", &["a1"], "h", vec![]),
        node("MatMul", &["h", "w2"], "m2", vec![]),
        node("Add", &["m2", "x"], "y", vec![]),
        node("Gemm", &["y", "w3", "b3"], "logits", vec![int("transB", 1)]),
    ];
    let init = vec![
        weight("w1", &[width, inner], 71, -0.2, 0.4),
        weight("b1", &[inner], 72, -0.3, 0.6),
        weight("w2", &[inner, width], 73, -0.2, 0.4),
        weight("w3", &[head, width], 74, -0.2, 0.4),
        weight("b3", &[head], 75, -0.3, 0.6),
    ];
    write_model(dir, &format!("mlp{rows}_{width}_{inner}"), &[rows, width], nodes, init)
}

fn options(precision: DType) -> CompileOptions {
    CompileOptions { precision, ..Default::default() }
}

/// The few-row kernels of the compiled program, in order.
fn skinny_kernels(path: &Path, options: &CompileOptions) -> Vec<KernelSource> {
    common::compiled_steps(path, options)
        .into_iter()
        .filter_map(|s| match s {
            Step::Gemm { skinny, .. } => Some(skinny),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn few_row_products_get_a_kernel_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    // Awkward sizes, then a GPT-2 small block's (the longest loops down K and along it).
    for (rows, sizes) in
        [(3, [200, 264, 517]), (4, [200, 264, 517]), (1, [768, 3072, 1000]), (4, [768, 3072, 1000])]
    {
        let path = mlp(dir.path(), rows, sizes);
        let head_width = sizes[2] as usize;
        for precision in [DType::F32, DType::F16] {
            let kernels = skinny_kernels(&path, &options(precision));
            assert_eq!(kernels.len(), 3, "{rows} rows, {precision}: one kernel a GEMM");
            let [first, second, head] = &kernels[..] else { unreachable!() };
            // The first two read [K, N] weights down K, the head [N, K] rows along K.
            for k in [first, second] {
                assert!(k.source.contains("B stored [K, N]"), "{}", k.source);
            }
            assert!(head.source.contains("B stored [N, K]"), "{}", head.source);
            // The epilogues cuBLASLt would run: the bias and ReLU, the residual, the bias.
            assert!(first.source.contains("fusec::relu(r)") && first.source.contains("bias[c]"));
            assert!(second.source.contains("residual[m *") && !second.source.contains("bias[c]"));
            assert!(head.source.contains("bias[c]") && !head.source.contains("fusec::relu"));
            let per_warp = match rows {
                1..=2 => 1,
                3..=4 => 2,
                _ => 4,
            };
            assert_eq!(head.grid as usize, head_width.div_ceil(4 * per_warp), "four warps a block");
            // Each asks L2 for the next product's weights (its last argument, the next kernel's
            // B, all of its bytes); the head, last, for none.
            let element = precision.size_bytes();
            let [width, inner, _] = sizes.map(|s| s as usize);
            for (k, next, bytes) in
                [(first, second, inner * width * element), (second, head, head_width * width * element)]
            {
                assert!(
                    k.source.contains(&format!("fusec::prefetch_l2(next_b, {bytes}ull)")),
                    "{}",
                    k.source
                );
                assert_eq!(k.args.last(), next.args.get(1), "{}: prefetches {:?}", k.name, k.args);
            }
            assert!(!head.source.contains("prefetch_l2(next_b"));
            for k in &kernels {
                let entry = format!("__launch_bounds__({}, 1) {}(", k.block, k.function);
                assert!(k.source.contains(&entry), "{}: no `{entry}`", k.name);
                if fusec::nvrtc::available() {
                    common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
                }
            }
        }
        common::forced_and_timed_match_tract(&path, rows as u64, &[(DType::F32, 1e-5), (DType::F16, 1e-2)]);
    }
    // Nine rows in f32: the library's call alone.
    let path = mlp(dir.path(), 9, [200, 264, 517]);
    assert!(skinny_kernels(&path, &options(DType::F32)).is_empty());
}

/// Tens of rows in a half type (a decoding step of a batch) get the tensor-core kernel: odd row
/// counts (a partial tile of 8), K in chunks of 32, an odd head width, and a GPT-2 small
/// block's sizes at 32 rows (K split over a cluster's blocks) and at 7 (one tile of rows,
/// whose bias is read at the kernel's start and residual after its wait, before the sums).
/// Every kernel through NVRTC (no spills); on a GPU, forced and chosen by timing, against tract.
#[test]
fn tens_of_rows_run_on_tensor_cores() {
    let dir = tempfile::tempdir().unwrap();
    for (rows, sizes) in [
        (13, [224, 288, 517]),
        (40, [224, 288, 517]),
        (64, [96, 160, 77]),
        (32, [768, 3072, 1000]),
        (7, [768, 3072, 1000]),
    ] {
        let path = mlp(dir.path(), rows, sizes);
        for precision in [DType::F16, DType::BF16] {
            let kernels = skinny_kernels(&path, &options(precision));
            assert_eq!(kernels.len(), 3, "{rows} rows, {precision}: one kernel a GEMM");
            for k in &kernels {
                assert!(
                    k.source.contains("on tensor cores") && k.source.contains("mma_m16n8k16"),
                    "{}",
                    k.source
                );
                if fusec::nvrtc::available() {
                    common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
                }
            }
            let [first, _, head] = &kernels[..] else { unreachable!() };
            assert!(first.source.contains("fusec::relu(r)") && first.source.contains("bias[c]"));
            // One tile of rows: the bias (a weight) read at the start, before the sums.
            let early = match std::env::var("FUSEC_SKINNY_MMA_EPILOGUE").as_deref().map(str::trim) {
                Ok("1") => true,
                Ok("0") => false,
                _ => rows <= 8,
            };
            assert_eq!(first.source.contains("    epilogue_reads(true, false);"), early, "{}", first.source);
            assert!(head.source.contains("B stored [N, K]") && head.source.contains("bias[c]"));
        }
        common::forced_and_timed_match_tract(&path, rows as u64, &[(DType::F16, 1e-2), (DType::BF16, 3e-2)]);
    }
}

/// A head through `MatMul` whose weights `[K, N]` have rows of an odd width (GPT-2's vocabulary,
/// 50,257 wide, exported this way) is read by rows, `[N, K]`, through a transpose that costs
/// no kernel, so it gets a kernel for a few rows (on CUDA cores at 3 rows, tensor cores at
/// 24; at one row and a vocabulary's width, eight columns a warp, eight warps a block, the
/// last block's columns ragged), storing the f32 logits itself. On a GPU, against tract, with
/// that kernel and with the library's.
#[test]
fn odd_width_weights_are_read_by_rows() {
    let dir = tempfile::tempdir().unwrap();
    for (rows, width) in [(1, 16411), (3, 517), (24, 517)] {
        let nodes = vec![node("MatMul", &["x", "w"], "logits", vec![])];
        let init = vec![weight("w", &[96, width], 76, -0.2, 0.4)];
        let path = write_model(dir.path(), &format!("head{rows}"), &[rows, 96], nodes, init);
        let steps = common::compiled_steps(&path, &options(DType::F16));
        // The input's cast to f16, then the GEMM storing f32 itself (the output's cast back
        // taken in): no transpose of its own, no cast kernel after it.
        assert_eq!(steps.len(), 2, "{steps:?}");
        let Step::Gemm { gemm, skinny: Some(kernel), epilogue: None, .. } = &steps[1] else {
            panic!("{steps:?}")
        };
        assert!(gemm.b.transposed && gemm.n == width as usize && gemm.k == 96, "{gemm:?}");
        assert_eq!(gemm.out, Some(DType::F32), "{gemm:?}");
        assert!(kernel.source.contains("B stored [N, K]"), "{}", kernel.source);
        assert!(kernel.source.contains("float* c_out"), "{}", kernel.source);
        if rows == 1 {
            assert_eq!((kernel.grid as usize, kernel.block), (16411usize.div_ceil(64), 256));
        }
        if fusec::nvrtc::available() {
            common::compiles_without_spills(kernel, common::ptxas().as_deref(), dir.path());
        }
        let (_, inputs, theirs) = common::tract_on_random_inputs(&path, rows as u64);
        if fusec::runtime::driver_available() {
            // fusec's kernel, then the library's (cuBLASLt storing f32 from f16 operands).
            for pinned in ["1", "0"] {
                std::env::set_var("FUSEC_SKINNY", pinned);
                common::gpu_matches_tract(&path, &options(DType::F16), &inputs, &theirs, 1e-2);
            }
            std::env::remove_var("FUSEC_SKINNY");
        }
    }
}

/// A vocabulary's head (`Gemm` with `transB`, 16,384 columns or more) at tens of rows in a half
/// type has a second kernel for a few rows beside the tensor-core one, timed against it at load:
/// its blocks copy A into shared memory once (`skinny_staged`). At awkward sizes (29 rows, an
/// odd width, a bias), through NVRTC and ptxas (no spills); on a GPU against tract with it
/// forced (`FUSEC_SKINNY=1 FUSEC_SKINNY_NARROW=1`), then chosen by timing.
#[test]
fn a_vocabulary_at_tens_of_rows_has_a_kernel_with_a_staged() {
    let dir = tempfile::tempdir().unwrap();
    for (rows, width, k) in [(29, 16411, 192), (8, 16400, 128)] {
        let nodes = vec![node("Gemm", &["x", "w", "b"], "logits", vec![int("transB", 1)])];
        let init = vec![weight("w", &[width, k], 77, -0.2, 0.4), weight("b", &[width], 78, -0.3, 0.6)];
        let path = write_model(dir.path(), &format!("vocabulary{rows}"), &[rows, k], nodes, init);
        for precision in [DType::F16, DType::BF16] {
            let steps = common::compiled_steps(&path, &options(precision));
            let staged = steps
                .iter()
                .find_map(|s| match s {
                    Step::Gemm { skinny_narrow: Some(second), .. } => Some(second.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{rows} rows, {precision}: no second kernel: {steps:?}"));
            assert!(staged.name.ends_with("_skinny_staged"), "{}", staged.name);
            assert!(staged.source.contains(&format!("uint4 xa[{rows} * {}]", k / 8)), "{}", staged.source);
            assert_eq!(staged.grid as usize, (width as usize).div_ceil(128));
            if fusec::nvrtc::available() {
                common::compiles_without_spills(&staged, common::ptxas().as_deref(), dir.path());
            }
        }
        let precisions = [(DType::F16, 1e-2), (DType::BF16, 3e-2)];
        common::forced_and_timed_match_tract_with(&path, rows as u64, &precisions, &["FUSEC_SKINNY_NARROW"]);
    }
}

/// In a decoding step the norm before a GEMM (with the residual add its kernel does) is taken
/// into the GEMM's kernel for a few rows: GPT-2's five LayerNorms (each with the GEMM right
/// after it: the QKV projection, the MLP's first product, the vocabulary), the Llama-style
/// decoder's RMSNorms likewise. At 5 rows and more the tensor-core kernel takes a norm in by
/// default only for an RMSNorm at 24 rows at most (folded). On a GPU, the step with them taken
/// in against tract.
#[test]
fn a_decoding_steps_norms_go_into_the_gemms_after_them() {
    // One sequence, and three (three rows of A normalised in the kernel), then 13 and 32.
    let cases = [
        ("gpt2_cache_ts.onnx", "layernorm", 1),
        ("llama_cache_ts.onnx", "rmsnorm", 1),
        ("gpt2_cache_ts.onnx", "layernorm", 3),
        // Tens of rows: the tensor-core kernel takes the norm in as it reads A.
        ("gpt2_cache_ts.onnx", "layernorm", 13),
        ("llama_cache_ts.onnx", "rmsnorm", 32),
        ("llama_cache_ts.onnx", "rmsnorm", 7),
        ("llama_cache_ts.onnx", "rmsnorm", 16),
    ];
    for (file, norm, batch) in cases {
        let expected = 5;
        let (path, mut options) = common::decoding_step(file, batch);
        // The norms as the model has them, their scales read (folded into the weights:
        // `tests/norm_scales.rs`).
        options.fold_norm_scales = false;
        let tensor_cores = batch >= 5;
        // (An RMSNorm at up to 24 rows folded into the tensor-core kernel: `tests/norm_folded.rs`.)
        let by_default = !tensor_cores || (norm == "rmsnorm" && batch <= 24);
        if !by_default {
            // Else the tensor-core kernel takes the norm in only when asked (slower on the H200).
            let apart = common::compiled_steps(&path, &options);
            assert!(
                !apart.iter().any(|s| matches!(s, Step::Gemm { absorbs: Some(_), .. })),
                "{file} at {batch}"
            );
            std::env::set_var("FUSEC_SKINNY_MMA_NORM", "1");
        }
        let steps = common::compiled_steps(&path, &options);
        std::env::remove_var("FUSEC_SKINNY_MMA_NORM");
        let absorbed: Vec<usize> = steps
            .iter()
            .filter_map(|s| match s {
                // The Llama-style MLP's down product takes its gate in (`tests/skinny_gate.rs`).
                Step::Gemm { absorbs: Some(j), skinny: Some(k), .. }
                    if !k.source.contains("A = x·σ(x)·y") =>
                {
                    assert!(k.source.contains("Norm of"), "{}", k.source);
                    assert_eq!(k.source.contains("on tensor cores"), tensor_cores, "{}", k.source);
                    if fusec::nvrtc::available() {
                        let dir = tempfile::tempdir().unwrap();
                        common::compiles_without_spills(k, common::ptxas().as_deref(), dir.path());
                    }
                    Some(*j)
                }
                _ => None,
            })
            .collect();
        assert_eq!(absorbed.len(), expected, "{file} at batch {batch}: {absorbed:?}");
        for (j, step) in steps.iter().enumerate() {
            let Step::Launch(kernel) = step else { continue };
            if kernel.name.contains(norm) {
                assert!(absorbed.contains(&j), "{file}: {} is not taken in", kernel.name);
            }
        }
        // GPT-2's last four add the residual stream first, and store it.
        if norm == "layernorm" {
            let summed = steps
                .iter()
                .filter(|s| matches!(s, Step::Gemm { absorbs: Some(_), skinny: Some(k), .. } if k.source.contains("__restrict__ h_out")))
                .count();
            assert_eq!(summed, 4, "{file} at batch {batch}");
        }
        if !by_default {
            std::env::set_var("FUSEC_SKINNY_MMA_NORM", "1");
        }
        common::forced_skinny_matches_tract(&path, &options, 3, 1e-2);
        std::env::remove_var("FUSEC_SKINNY_MMA_NORM");
    }
}

/// `fusec compile` says which GEMMs carry a kernel for a few rows (timed at load), apart from
/// the program's own kernels.
#[test]
fn compile_reports_the_kernels_for_a_few_rows() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_fusec"));
    if !exe.exists() {
        // This test binary was copied to another machine (a GPU machine) without the CLI.
        println!("skipped: no fusec binary at {}", exe.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("step.bundle");
    let model = common::model_path("gpt2_cache_ts.onnx");
    let out = std::process::Command::new(exe)
        .args(["compile", model.to_str().unwrap(), "-o", bundle.to_str().unwrap(), "--precision", "fp16"])
        .args(["--dim", "batch=1", "--dim", "seq=1", "--dim", "past=16", "--dim", "total=past+seq"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Nine GEMMs: two layers' four, and the vocabulary.
    assert!(
        stdout.contains("(9 cuBLAS GEMMs; 9 GEMMs also with a kernel for a few rows, chosen at load)"),
        "{stdout}"
    );
}

/// A vocabulary-wide product at one row (16,411 columns over 768, after a LayerNorm the
/// kernel takes in, weights `[N, K]` through `Gemm` with `transB` and `[K, N]` through
/// `MatMul`): two blocks a multiprocessor (its blocks come in waves), and ptxas fits it in
/// the 128 registers that leaves, without spills.
#[test]
fn a_vocabulary_runs_two_blocks_a_multiprocessor_without_spills() {
    let dir = tempfile::tempdir().unwrap();
    for transposed in [true, false] {
        let head = match transposed {
            true => node("Gemm", &["h", "w"], "logits", vec![int("transB", 1)]),
            false => node("MatMul", &["h", "w"], "logits", vec![]),
        };
        let nodes = vec![
            node("MatMul", &["x", "w0"], "y", vec![]),
            node("LayerNormalization", &["y", "g", "b"], "h", vec![]),
            head,
        ];
        let w = if transposed { [16411, 768] } else { [768, 16411] };
        let init = vec![
            weight("w0", &[768, 768], 81, -0.05, 0.1),
            weight("g", &[768], 82, 0.5, 1.0),
            weight("b", &[768], 83, -0.1, 0.2),
            weight("w", &w, 84, -0.05, 0.1),
        ];
        let path = write_model(dir.path(), &format!("vocab{transposed}"), &[1, 768], nodes, init);
        let kernels = skinny_kernels(&path, &options(DType::F16));
        let wide: Vec<&KernelSource> = kernels.iter().filter(|k| k.source.contains("16411")).collect();
        assert_eq!(wide.len(), 1, "{transposed}: {kernels:?}");
        assert!(wide[0].source.contains("__launch_bounds__(256, 2)"), "{}", wide[0].source);
        assert!(wide[0].source.contains("Norm of"), "{transposed}: the norm not taken in");
        if fusec::nvrtc::available() {
            common::compiles_without_spills(wide[0], common::ptxas().as_deref(), dir.path());
        }
    }
}

/// A LayerNorm (of a product and its input) before a product whose weights are read by rows
/// (an odd width) is taken into
/// its kernel, which copies the norm's scale and shift into shared memory before its wait and
/// reads them there a pack at a time; at one and three rows, through NVRTC without spills and,
/// on a GPU, against tract with the copies and without (`FUSEC_SKINNY_NORM_STAGED=0`).
#[test]
fn a_norm_before_weights_read_by_rows_reads_its_scale_from_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    for rows in [1, 3] {
        let nodes = vec![
            node("MatMul", &["x", "w0"], "m0", vec![]),
            node("Add", &["m0", "x"], "h", vec![]),
            node("LayerNormalization", &["h", "g", "b"], "n", vec![common::onnx::float("epsilon", 1e-5)]),
            node("MatMul", &["n", "w"], "logits", vec![]),
        ];
        let init = vec![
            weight("w0", &[264, 264], 80, -0.2, 0.4),
            weight("g", &[264], 77, 0.5, 1.0),
            weight("b", &[264], 78, -0.3, 0.6),
            weight("w", &[264, 517], 79, -0.2, 0.4),
        ];
        let path = write_model(dir.path(), &format!("normed{rows}"), &[rows, 264], nodes, init);
        let kernels = skinny_kernels(&path, &options(DType::F16));
        let [_, kernel] = kernels.as_slice() else { panic!("{kernels:?}") };
        for expected in
            ["B stored [N, K]", "Norm of", "stage_norm(gamma, beta, ng, nb)", "gp.v[v]", "bp.v[v]"]
        {
            assert!(kernel.source.contains(expected), "no `{expected}`: {}", kernel.source);
        }
        if fusec::nvrtc::available() {
            common::compiles_without_spills(kernel, common::ptxas().as_deref(), dir.path());
        }
        std::env::set_var("FUSEC_SKINNY_NORM_STAGED", "0");
        let apart = skinny_kernels(&path, &options(DType::F16));
        std::env::remove_var("FUSEC_SKINNY_NORM_STAGED");
        assert!(apart[1].source.contains("Norm of") && !apart[1].source.contains("stage_norm("));
        let (_, inputs, theirs) = common::tract_on_random_inputs(&path, 10 + rows as u64);
        if fusec::runtime::driver_available() {
            std::env::set_var("FUSEC_SKINNY", "1");
            for staged in ["1", "0"] {
                std::env::set_var("FUSEC_SKINNY_NORM_STAGED", staged);
                common::gpu_matches_tract(&path, &options(DType::F16), &inputs, &theirs, 1e-2);
            }
            std::env::remove_var("FUSEC_SKINNY_NORM_STAGED");
            std::env::remove_var("FUSEC_SKINNY");
        }
    }
}

/// The tensor-core kernel reads the residual of every output a thread stores before it stores
/// any (the residual is not `__restrict__`: it may be the output's own memory, so a load after
/// a store stays after it, and read output by output each is a trip to L2 at the kernel's end):
/// in the PTX of a GPT-2 small MLP-down at 32 rows (a cluster's blocks storing a share each)
/// and at 13 rows of awkward sizes, every load of the residual comes before the first store.
#[test]
fn a_residual_is_read_for_all_outputs_before_any_is_stored() {
    if !fusec::nvrtc::available() {
        eprintln!("skipped: NVRTC is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (rows, sizes) in [(32, [768, 3072, 1000]), (13, [224, 288, 517])] {
        let path = mlp(dir.path(), rows, sizes);
        let kernels = skinny_kernels(&path, &options(DType::F16));
        let residual = &kernels[1];
        assert!(residual.source.contains("residual[m *"), "{}", residual.source);
        let ptx = fusec::nvrtc::compile(residual, "sm_90").unwrap();
        let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
        // Loads from global memory that may alias a store (A and the weights are `.nc`).
        let loads: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].starts_with("ld.global.") && !lines[i].starts_with("ld.global.nc"))
            .collect();
        let first_store = lines.iter().position(|l| l.starts_with("st.global.")).expect("a store");
        assert!(!loads.is_empty(), "{rows} rows: no load of the residual in\n{ptx}");
        assert!(
            loads.iter().all(|&i| i < first_store),
            "{rows} rows: a residual load after a store (lines {loads:?}, first store {first_store})"
        );
    }
}
