//! A decoding step's key and value appends to its cache (updated in place): one kernel a
//! layer in a prompt step, inside the layer's attention kernel in a one-token step of a half
//! type. And where the new key and value are not 16-byte runs in memory — the projection lays
//! a row's two heads side by side, element by element — the kernel reads them element by
//! element: its kernels through NVRTC (no spills); on a GPU, every output — attention's and
//! both caches — against tract.

mod common;

use std::path::{Path, PathBuf};

use common::onnx::{floats, int, int64s, ints, node, value_info, weight};
use fusec::codegen::Step;
use fusec::import::ImportOptions;
use fusec::ir::DType;
use fusec::pipeline::CompileOptions;
use prost::Message;
use tract_onnx::pb::{GraphProto, ModelProto, OperatorSetIdProto};

/// Cached positions.
const PAST: i64 = 5;
/// Heads and their width.
const HEADS: i64 = 2;
const WIDTH: i64 = 32;

/// One token's attention over a cache of [`PAST`] positions: `x [1, 1, 64]`, `past_key` and
/// `past_value` `[1, 2, PAST, 32]` in; the attention's output and `present_key`,
/// `present_value` (`Concat(past, new)`) out. The query is laid out head after head; the new
/// key and value head beside head (`[.., 32, 2]`, transposed to `[1, 2, 1, 32]`).
fn model(dir: &Path) -> PathBuf {
    let hidden = HEADS * WIDTH;
    let nodes = vec![
        node("MatMul", &["x", "wq"], "q0", vec![]),
        node("Reshape", &["q0", "by_head"], "q1", vec![]),
        node("Transpose", &["q1"], "q", vec![ints("perm", &[0, 2, 1, 3])]),
        node("MatMul", &["x", "wk"], "k0", vec![]),
        node("Reshape", &["k0", "by_element"], "k1", vec![]),
        node("Transpose", &["k1"], "k", vec![ints("perm", &[0, 3, 1, 2])]),
        node("MatMul", &["x", "wv"], "v0", vec![]),
        node("Reshape", &["v0", "by_element"], "v1", vec![]),
        node("Transpose", &["v1"], "v", vec![ints("perm", &[0, 3, 1, 2])]),
        node("Concat", &["past_key", "k"], "present_key", vec![int("axis", 2)]),
        node("Concat", &["past_value", "v"], "present_value", vec![int("axis", 2)]),
        node("Transpose", &["present_key"], "kt", vec![ints("perm", &[0, 1, 3, 2])]),
        node("MatMul", &["q", "kt"], "s", vec![]),
        node("Mul", &["s", "scale"], "scaled", vec![]),
        node("Softmax", &["scaled"], "p", vec![int("axis", -1)]),
        node("MatMul", &["p", "present_value"], "out", vec![]),
    ];
    let init = vec![
        weight("wq", &[hidden, hidden], 71, -0.3, 0.6),
        weight("wk", &[hidden, hidden], 72, -0.3, 0.6),
        weight("wv", &[hidden, hidden], 73, -0.3, 0.6),
        floats("scale", &[1.0 / (WIDTH as f32).sqrt()]),
        int64s("by_head", &[1, 1, HEADS, WIDTH]),
        int64s("by_element", &[1, 1, WIDTH, HEADS]),
    ];
    let cache = [1, HEADS, PAST, WIDTH];
    let graph = GraphProto {
        name: "cache_appends".into(),
        node: nodes,
        initializer: init,
        input: vec![
            value_info("x", &[1, 1, hidden]),
            value_info("past_key", &cache),
            value_info("past_value", &cache),
        ],
        output: ["out", "present_key", "present_value"]
            .iter()
            .map(|&name| tract_onnx::pb::ValueInfoProto { name: name.into(), ..Default::default() })
            .collect(),
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 18 }],
        graph: Some(graph),
        ..Default::default()
    };
    let path = dir.join("cache_appends.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

fn in_place() -> CompileOptions {
    CompileOptions { precision: DType::F16, cache_in_place: true, ..Default::default() }
}

#[test]
fn appends_inside_attention_read_a_new_key_laid_out_element_by_element() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let steps = common::compiled_steps(&path, &in_place());
    let sources: Vec<_> = steps.iter().flat_map(Step::sources).collect();
    assert!(!sources.iter().any(|k| k.source.contains(": append\n")), "the appends joined attention");
    let attention: Vec<_> =
        sources.iter().filter(|k| k.source.contains("Attention of one query row")).collect();
    assert_eq!(attention.len(), 1, "one decoding attention kernel");
    let kernel = attention[0];
    // The new key and value element by element (`element(…)`), not as 16-byte loads.
    assert!(kernel.source.contains("auto element = [&]"), "{}", kernel.source);
    assert!(
        kernel.source.contains("(fresh ? kn :") && kernel.source.contains("(fresh ? vn :"),
        "{}",
        kernel.source
    );
    if fusec::nvrtc::available() {
        common::compiles_without_spills(kernel, common::ptxas().as_deref(), dir.path());
    }
    if !fusec::runtime::driver_available() {
        println!("skipped the GPU run: no CUDA driver on this machine");
        return;
    }
    let options = CompileOptions { arch: Some("sm_90".into()), ..in_place() };
    let bundle = fusec::compile(&path, &options).unwrap_or_else(|e| panic!("{e}"));
    // The cache goes in in the half type; tract takes the same values, rounded, in f32.
    let model = fusec::import::import(&path, &Default::default()).unwrap_or_else(|e| panic!("{e}"));
    let (inputs, values) = common::in_bundle_types(&bundle, common::random_inputs(&model, 29));
    let theirs = fusec::import::run_tract(&path, &values).unwrap_or_else(|e| panic!("{e}"));
    let mut session = fusec::runtime::Session::new(&bundle, 0).unwrap_or_else(|e| panic!("{e}"));
    let ours = session.run(&inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ours.len(), 3);
    for ((name, ours), theirs) in ours.iter().zip(&theirs) {
        let err = fusec::ir::rel_l2(&ours.cast(DType::F32), theirs);
        println!("{name}: rel-L2 {err:e} against tract");
        assert!(err <= 1e-2, "{name}: rel-L2 {err:e}");
    }
}

/// A decoder layer's key and value appends to its cache in place are one kernel storing both
/// (they share a geometry, read one projection and are read by one attention), not a launch
/// each: one append kernel a layer in a prompt step; in the one-token step (half types) none,
/// the layer's attention kernel storing both itself and reading the new position from
/// registers.
#[test]
fn a_layers_key_and_value_appends_are_one_kernel() {
    for file in
        ["gpt2_cache_ts.onnx", "llama_cache_ts.onnx", "gpt2_cache_dynamo.onnx", "llama_cache_dynamo.onnx"]
    {
        for seq in [1, 4] {
            let options = CompileOptions {
                import: ImportOptions::default()
                    .dim("batch", 2)
                    .dim("seq", seq)
                    .dim("past", 9)
                    .dim("total", 9 + seq),
                precision: DType::F16,
                cache_in_place: true,
                ..Default::default()
            };
            let path = common::model_path(file);
            let (plan, _) = fusec::pipeline::plan_reporting(&path, &options, &mut |_| {}).unwrap();
            let steps = fusec::codegen::generate(&plan).unwrap();
            let launches = |about: &str| -> Vec<String> {
                steps
                    .iter()
                    .filter_map(|s| match s {
                        fusec::codegen::Step::Launch(k) if k.source.contains(&format!(": {about}\n")) => {
                            Some(k.source.clone())
                        }
                        _ => None,
                    })
                    .collect()
            };
            let (appends, attention) = (launches("append"), launches("attention"));
            assert_eq!(attention.len(), 2, "{file}, {seq} tokens: one attention kernel a layer");
            let stores_both = |k: &String| k.contains("out1") && !k.contains("out2");
            if seq == 1 {
                assert!(appends.is_empty(), "{file}, one token: the appends joined attention");
                // Each attention kernel reads its layer's whole key and value caches (the
                // floor `bench` prints counts them).
                let graph = &plan.graph;
                for kernel in plan.kernels.iter().filter(|k| k.kind == fusec::fusion::KernelKind::Attention) {
                    let cache: u64 = kernel
                        .nodes
                        .iter()
                        .filter(|&&n| matches!(graph.node(n).op, fusec::ir::Op::Append { .. }))
                        .map(|&n| graph.node(n).ty.size_bytes() as u64)
                        .sum();
                    assert!(cache > 0, "{file}: an attention kernel without its appends");
                    assert!(plan.kernel_traffic_bytes(kernel) >= cache, "{file}: the caches' reads counted");
                }
                // The token's embedding: its gather's kernel counts the rows it picks, not the
                // whole table (the floor is the bytes a step reads).
                let mut tables = 0;
                for kernel in &plan.kernels {
                    for &n in &kernel.nodes {
                        let fusec::ir::Op::Gather { .. } = graph.node(n).op else { continue };
                        let table = graph.node(graph.inputs_of(n)[0]).ty.size_bytes() as u64;
                        let picked = graph.node(n).ty.size_bytes() as u64;
                        if table >= 16 * picked {
                            tables += 1;
                            let bytes = plan.kernel_traffic_bytes(kernel);
                            assert!(
                                bytes < table / 2,
                                "{file}: a gather's kernel counted {bytes} bytes of a {table}-byte table"
                            );
                        }
                    }
                }
                assert!(tables > 0, "{file}: no embedding gather");
                for k in &attention {
                    let stores = k.lines().filter(|l| l.contains("*reinterpret_cast<uint4*>((out")).count();
                    assert_eq!(stores, 2, "{file}: the new key and value stored once each\n{k}");
                    // The new key and value read as 16-byte runs where the projection left
                    // them (memory, or the shared memory of the kernel that computes the
                    // projection of a batch's rows itself, `codegen::attention::rows`), and
                    // taken from registers at their position, not from the cache.
                    let (from, taken) = match k.contains("A decoding step of") {
                        true => (
                            "n = *reinterpret_cast<const uint4*>(&qkv_s[",
                            ["kr[u] = kn();", "vr[u] = vn();"],
                        ),
                        false => {
                            ("n = *reinterpret_cast<const uint4*>((in", ["(fresh ? kn :", "(fresh ? vn :"])
                        }
                    };
                    assert_eq!(k.matches(from).count(), 2, "{file}\n{k}");
                    assert!(taken.iter().all(|t| k.contains(t)), "{file}\n{k}");
                }
            } else {
                assert_eq!(appends.len(), 2, "{file}, {seq} tokens: one append kernel a layer");
                assert!(appends.iter().all(stores_both), "{file}: {appends:?}");
            }
        }
    }
}
