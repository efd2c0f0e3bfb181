//! Shared by the integration tests: the fixtures in models/, the shapes to try them at, and
//! random inputs for them.
#![allow(dead_code)]

pub mod cli;
pub mod decoders;
pub mod onnx;

use std::path::PathBuf;

use std::path::Path;

use fusec::import::{import, summarize, ImportError, ImportOptions, Model};
use fusec::ir::{random_input, DType, Tensor};

/// A fixture in models/ (or in `$FUSEC_MODELS_DIR`, for test binaries run elsewhere).
pub fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("FUSEC_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    dir.join(file)
}

/// Symbolic dims to try each fixture at: batch 1 and 3, sequence 1 and 7 (and more).
pub fn shape_variants(file: &str) -> Vec<ImportOptions> {
    let text = |b, s| ImportOptions::default().dim("batch", b).dim("seq", s);
    if file.starts_with("vit") {
        return vec![ImportOptions::default().dim("batch", 1), ImportOptions::default().dim("batch", 3)];
    }
    if has_cache(file) {
        // A prompt's step (4 tokens after 3 cached), decoding steps (one token after 5 and 9),
        // a prompt's step after one cached position (as `fusec generate` compiles it).
        let step = |b, s, past: usize| text(b, s).dim("past", past).dim("total", past + s);
        return vec![step(2, 1, 5), step(1, 4, 3), step(3, 1, 9), step(2, 4, 1)];
    }
    if ["bert", "gpt2", "llama"].iter().any(|p| file.starts_with(p)) {
        return vec![text(1, 7), text(3, 1), text(2, 13)];
    }
    if file == "op_coverage.onnx" {
        return vec![ImportOptions::default()];
    }
    vec![ImportOptions::default().dim("batch", 1), ImportOptions::default().dim("batch", 3)]
}

/// Import options for `file` with batch `batch` (`N` or a range `LO..HI`) and, for the text
/// models, seq 7.
pub fn batch_dims(file: &str, batch: &str) -> ImportOptions {
    dims_at(file, batch, "7")
}

/// Whether a fixture's inputs have a sequence dim (`seq`).
pub fn has_seq(file: &str) -> bool {
    ["bert", "gpt2", "llama"].iter().any(|p| file.starts_with(p))
}

/// Whether a fixture is a decoder with its key/value cache (`past`, and `total` = `past` +
/// `seq`, dims of their own).
pub fn has_cache(file: &str) -> bool {
    file.contains("_cache")
}

/// Whether a fixture has a sequence dim that a range can follow (not a decoder's with a
/// cache: its `total` is `past` + `seq`, a sum).
pub fn seq_range(file: &str) -> bool {
    has_seq(file) && !has_cache(file)
}

/// The cached length the tests give a decoder with a cache.
pub const PAST: usize = 5;

/// The dims of a fixture at `batch` and `seq` (each a size or a range `LO..HI`); `seq` only
/// where the model has one; a decoder with a cache at [`PAST`] cached positions (`seq` then
/// one size: `total` is a sum, which ranges do not follow yet).
pub fn dims_at(file: &str, batch: &str, seq: &str) -> ImportOptions {
    let mut dims: Vec<fusec::import::DimSpec> = vec![format!("batch={batch}").parse().expect("a dim")];
    if has_seq(file) {
        dims.push(format!("seq={seq}").parse().expect("a dim"));
    }
    if has_cache(file) {
        let seq: usize = seq.parse().expect("one sequence length for a decoder with a cache");
        dims.push(format!("past={PAST}").parse().expect("a dim"));
        dims.push(format!("total={}", PAST + seq).parse().expect("a dim"));
    }
    ImportOptions::new(vec![], dims)
}

/// Every fixture in models/.
pub fn all_fixtures() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(model_path(""))
        .expect("models/ exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".onnx"))
        .collect();
    files.sort();
    files
}

/// `inputs` in the element types `bundle` declares for them (a cache updated in place goes in
/// in its half type, as it lies inside its present), and the same values as tract takes them:
/// half types widened to f32, the rounding kept.
pub fn in_bundle_types(
    bundle: &fusec::Bundle,
    inputs: Vec<(String, Tensor)>,
) -> (Vec<(String, Tensor)>, Vec<Tensor>) {
    let ours: Vec<(String, Tensor)> = inputs
        .into_iter()
        .map(|(name, t)| {
            let spec = bundle.header.inputs.iter().find(|i| i.name == name).unwrap();
            let dtype = DType::from_name(&spec.dtype).unwrap();
            let t = if dtype == t.dtype() { t } else { t.cast(dtype) };
            (name, t)
        })
        .collect();
    let theirs = ours
        .iter()
        .map(
            |(_, t)| {
                if t.dtype().is_float() && t.dtype() != DType::F32 {
                    t.cast(DType::F32)
                } else {
                    t.clone()
                }
            },
        )
        .collect();
    (ours, theirs)
}

/// The fixture `file` at its shape variant `variant` ([`shape_variants`]): compiled with
/// default options, and imported (for its inputs).
pub fn compiled_variant(file: &str, variant: usize) -> (fusec::Bundle, Model) {
    let options = shape_variants(file).remove(variant);
    let path = model_path(file);
    let bundle =
        fusec::compile(&path, &fusec::CompileOptions { import: options.clone(), ..Default::default() })
            .unwrap();
    (bundle, import(&path, &options).unwrap())
}

/// Random, non-zero inputs for every input of `model`: token ids below the fixtures'
/// vocabulary of 512, floats in [-2, 2), padding masks right-padded and token types 0 then 1
/// (`random_input`).
pub fn random_inputs(model: &Model, seed: u64) -> Vec<(String, Tensor)> {
    model
        .graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let node = model.graph.node(id);
            let (low, high) = if node.ty.dtype == DType::I64 || node.ty.dtype == DType::I32 {
                (1.0, 512.0)
            } else {
                (-2.0, 2.0)
            };
            (node.name.clone(), random_input(&node.name, &node.ty, seed + i as u64, low, high))
        })
        .collect()
}

/// `path` imported as it is, random inputs for it ([`random_inputs`] with `seed`) and tract's
/// outputs on them.
pub fn tract_on_random_inputs(path: &Path, seed: u64) -> (Model, Vec<(String, Tensor)>, Vec<Tensor>) {
    tract_on_random_inputs_with(path, &ImportOptions::default(), seed)
}

/// [`tract_on_random_inputs`] with the model imported with `options` (its dims, say).
pub fn tract_on_random_inputs_with(
    path: &Path,
    options: &ImportOptions,
    seed: u64,
) -> (Model, Vec<(String, Tensor)>, Vec<Tensor>) {
    let model = import(path, options).unwrap_or_else(|e| panic!("{e}"));
    let inputs = random_inputs(&model, seed);
    let values: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    let theirs =
        fusec::import::run_tract(path, &values).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (model, inputs, theirs)
}

/// The program `fusec compile` makes of `path` with `options`, as steps, each generated kernel
/// compiled with NVRTC for sm_90 where NVRTC is found (a reason printed where not).
pub fn compiled_steps(path: &Path, options: &fusec::pipeline::CompileOptions) -> Vec<fusec::codegen::Step> {
    let (plan, _) =
        fusec::pipeline::plan_reporting(path, options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let steps = fusec::codegen::generate(&plan).unwrap_or_else(|e| panic!("{e}"));
    if fusec::nvrtc::available() {
        for source in steps.iter().flat_map(fusec::codegen::Step::sources) {
            fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{}: {e}", source.name));
        }
    } else {
        eprintln!("skipping NVRTC compilation: NVRTC not found");
    }
    steps
}

/// The few-row kernels of `steps` that take in the op before their product (a norm), in order.
pub fn absorbing_kernels(steps: &[fusec::codegen::Step]) -> Vec<&fusec::codegen::KernelSource> {
    steps
        .iter()
        .filter_map(|s| match s {
            fusec::codegen::Step::Gemm { absorbs: Some(_), skinny: Some(k), .. } => Some(k),
            _ => None,
        })
        .collect()
}

/// The bundle of `path` (compiled with `options` for sm_90) run on the GPU on `inputs`, its
/// first output against `theirs` (tract's) within `tolerance` rel-L2; a printed reason and
/// nothing else where no CUDA driver is found.
pub fn gpu_matches_tract(
    path: &Path,
    options: &fusec::pipeline::CompileOptions,
    inputs: &[(String, Tensor)],
    theirs: &[Tensor],
    tolerance: f64,
) {
    if !fusec::runtime::driver_available() {
        println!("skipped the GPU run of {}: no CUDA driver on this machine", path.display());
        return;
    }
    let options = fusec::pipeline::CompileOptions { arch: Some("sm_90".into()), ..options.clone() };
    let bundle = fusec::compile(path, &options).unwrap_or_else(|e| panic!("{e}"));
    let mut session = fusec::runtime::Session::new(&bundle, 0).unwrap_or_else(|e| panic!("{e}"));
    let ours = session.run(inputs).unwrap_or_else(|e| panic!("{e}"));
    let err = fusec::ir::rel_l2(&ours[0].1, &theirs[0]);
    println!("{}: rel-L2 {err:e} against tract on the GPU", path.display());
    assert!(err <= tolerance, "{} on the GPU: rel-L2 {err:e}", path.display());
}

/// `source` through NVRTC for sm_90 and, where `ptxas` is given, through it: panics on an
/// error or a spill. Whether ptxas checked it.
pub fn compiles_without_spills(
    source: &fusec::codegen::KernelSource,
    ptxas: Option<&Path>,
    dir: &Path,
) -> bool {
    let ptx = fusec::nvrtc::compile(source, "sm_90").unwrap_or_else(|e| panic!("{}: {e}", source.name));
    let Some(ptxas) = ptxas else { return false };
    let path = dir.join(format!("{}.ptx", source.name));
    std::fs::write(&path, &ptx).unwrap();
    let out = std::process::Command::new(ptxas)
        .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
        .arg(&path)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: ptxas failed: {report}", source.name);
    assert!(report.contains("0 bytes spill stores, 0 bytes spill loads"), "{}: {report}", source.name);
    true
}

/// ptxas: `$FUSEC_PTXAS`, the wheel that `.ci/run` installs under `.nvrtc/`, or `PATH`.
pub fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FUSEC_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let wheel = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".nvrtc/nvidia/cu13/bin/ptxas");
    if wheel.exists() {
        return Some(wheel);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join("ptxas"))
        .find(|p| p.exists())
}

/// The op a case is about, from its name: the longest supported op type that the name (less
/// `test_` and underscores) starts with (`test_layer_normalization_…_expanded` →
/// LayerNormalization), else the case's first op.
pub fn case_op(name: &str, ops: &[String]) -> String {
    let rest = name.trim_start_matches("test_").replace('_', "");
    fusec::import::supported_ops()
        .into_iter()
        .filter(|op| rest.starts_with(&op.to_lowercase()))
        .max_by_key(|op| op.len())
        .map(String::from)
        .unwrap_or_else(|| {
            if ops.is_empty() {
                "Constant".into()
            } else {
                name.trim_start_matches("test_").to_string()
            }
        })
}

/// Imports a case. Node tests pass axes, shapes, repeats and scales as graph inputs, which
/// fusec needs at compile time: when import says so, the integer inputs and the small 1-D ones
/// after the first are frozen to the first data set's values (the data set then feeds only the
/// others).
pub fn import_case(
    case: &Path,
    inputs: &[Tensor],
) -> Result<(Model, ImportOptions, Vec<usize>), ImportError> {
    let path = case.join("model.onnx");
    match import(&path, &ImportOptions::default()) {
        Err(ImportError::Node { message, .. }) if message.contains("must be a constant") => {
            let summary = summarize(&path)?;
            // Integer inputs, and small 1-D float ones after the first (Resize's scales and
            // roi, Pad's value).
            let small = |t: &Tensor| t.shape().len() <= 1 && t.shape().iter().product::<usize>() <= 16;
            let frozen: Vec<usize> = (0..summary.inputs.len())
                .filter(|&k| inputs[k].dtype().is_int() || (k > 0 && small(&inputs[k])))
                .collect();
            let constants =
                frozen.iter().map(|&k| (summary.inputs[k].name.clone(), inputs[k].clone())).collect();
            let options = ImportOptions { constants, ..ImportOptions::default() };
            Ok((import(&path, &options)?, options, frozen))
        }
        other => other.map(|m| (m, ImportOptions::default(), Vec::new())),
    }
}

pub fn cases_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("FUSEC_ONNX_NODE_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".onnx-node-cases"));
    dir.is_dir().then_some(dir)
}

/// A seeded xorshift64 generator (`seed` not 0), for reproducible damage to files.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// `bytes` with 1 to `most` bytes overwritten by `next`'s values at positions below `span`,
/// then cut at a random length when `truncate`.
pub fn mutated(
    bytes: &[u8],
    next: &mut impl FnMut() -> u64,
    most: u64,
    span: usize,
    truncate: bool,
) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..1 + next() % most {
        let at = (next() as usize) % span;
        out[at] = next() as u8;
    }
    if truncate {
        out.truncate((next() as usize) % out.len());
    }
    out
}

/// A decoding step's program of cache fixture `file` (`models/`): `batch` sequences, one new
/// token each, 16 cached positions, fp16. The cache is copied rather than updated in place, so
/// the inputs stay f32, as tract takes them.
pub fn decoding_step(file: &str, batch: usize) -> (PathBuf, fusec::pipeline::CompileOptions) {
    let batch = format!("batch={batch}");
    let dims = [batch.as_str(), "seq=1", "past=16", "total=17"].iter().map(|d| d.parse().unwrap()).collect();
    let options = fusec::pipeline::CompileOptions {
        import: ImportOptions::new(vec![], dims),
        precision: DType::F16,
        ..Default::default()
    };
    (model_path(file), options)
}

/// On a GPU, the model at each `(precision, tolerance)` against tract on random inputs
/// (`seed`), the kernels for a few rows forced, then chosen by timing (whichever wins, the same
/// outputs).
pub fn forced_and_timed_match_tract(path: &Path, seed: u64, precisions: &[(DType, f64)]) {
    forced_and_timed_match_tract_with(path, seed, precisions, &[]);
}

/// [`forced_and_timed_match_tract`] with the knobs `also` set too while the kernels are forced
/// (`FUSEC_SKINNY_NARROW`: their second form in the first's place).
pub fn forced_and_timed_match_tract_with(path: &Path, seed: u64, precisions: &[(DType, f64)], also: &[&str]) {
    let (_, inputs, theirs) = tract_on_random_inputs(path, seed);
    if !fusec::runtime::driver_available() {
        println!("skipped the GPU runs of {}: no CUDA driver on this machine", path.display());
        return;
    }
    for forced in [true, false] {
        std::env::set_var("FUSEC_SKINNY", if forced { "1" } else { "" });
        for knob in also {
            std::env::set_var(knob, if forced { "1" } else { "" });
        }
        for &(precision, tolerance) in precisions {
            let options = fusec::pipeline::CompileOptions { precision, ..Default::default() };
            gpu_matches_tract(path, &options, &inputs, &theirs, tolerance);
        }
    }
    std::env::remove_var("FUSEC_SKINNY");
    for knob in also {
        std::env::remove_var(knob);
    }
}

/// On a GPU, the program of `path` compiled with `options`, its kernels for a few rows forced
/// (`FUSEC_SKINNY=1`), against tract on random inputs (`seed`) within `tolerance`; without one,
/// says that it skipped.
pub fn forced_skinny_matches_tract(
    path: &Path,
    options: &fusec::pipeline::CompileOptions,
    seed: u64,
    tolerance: f64,
) {
    let (_, inputs, theirs) = tract_on_random_inputs_with(path, &options.import, seed);
    if !fusec::runtime::driver_available() {
        println!("skipped the GPU run of {}: no CUDA driver on this machine", path.display());
        return;
    }
    std::env::set_var("FUSEC_SKINNY", "1");
    gpu_matches_tract(path, options, &inputs, &theirs, tolerance);
    std::env::remove_var("FUSEC_SKINNY");
}
