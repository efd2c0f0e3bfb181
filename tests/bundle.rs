//! The bundle file: round trip, and clear errors for damaged or foreign files.

mod common;

use fusec::bundle::{Bundle, BundleError, FORMAT_VERSION};
use fusec::import::ImportOptions;
use fusec::runtime::{RuntimeError, Session};
use fusec::CompileOptions;

fn bundle() -> Bundle {
    let options = CompileOptions { import: ImportOptions::default().dim("batch", 2), ..Default::default() };
    fusec::compile(&common::model_path("mlp_block.onnx"), &options).unwrap()
}

#[test]
fn round_trip_keeps_everything() {
    let b = bundle();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.bundle");
    b.save(&path).unwrap();
    let loaded = Bundle::load(&path).unwrap();
    assert_eq!(loaded, b);
    // gemm+bias+gelu (erf: cuBLAS + epilogue kernel), gemm+bias (one cuBLASLt call), LayerNorm.
    assert_eq!((loaded.header.kernels, loaded.header.launches, loaded.header.gemm_calls), (3, 4, 2));
    assert_eq!(loaded.header.precision, fusec::ir::DType::F32);
    assert!(!loaded.weights.is_empty());
    let options = CompileOptions {
        import: ImportOptions::default().dim("batch", 2),
        precision: fusec::ir::DType::BF16,
        ..Default::default()
    };
    let half = fusec::compile(&common::model_path("mlp_block.onnx"), &options).unwrap();
    assert_eq!(half.header.precision, fusec::ir::DType::BF16);
    // bf16 weights take half the bytes; inputs and outputs stay f32.
    assert!(half.weights.len() < b.weights.len() * 3 / 4, "{} vs {}", half.weights.len(), b.weights.len());
    assert_eq!(half.header.inputs[0].dtype, "f32");
    assert_eq!(half.header.outputs[0].dtype, "f32");
}

#[test]
fn damaged_bundles_are_refused() {
    let bytes = bundle().to_bytes().unwrap();
    let truncated = Bundle::from_bytes(&bytes[..bytes.len() - 100], "t.bundle").unwrap_err();
    assert!(matches!(truncated, BundleError::Truncated { .. } | BundleError::Checksum { .. }), "{truncated}");
    assert!(truncated.to_string().contains("t.bundle"));
    let mut corrupted = bytes.clone();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0x40;
    let err = Bundle::from_bytes(&corrupted, "c.bundle").unwrap_err();
    assert!(matches!(err, BundleError::Checksum { .. }), "{err}");
    let mut other_version = bytes.clone();
    other_version[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let err = Bundle::from_bytes(&other_version, "v.bundle").unwrap_err();
    assert!(matches!(err, BundleError::Version { found, .. } if found == FORMAT_VERSION + 1), "{err}");
    assert!(err.to_string().contains("recompile"));
    let err = Bundle::from_bytes(b"PK\x03\x04 not a bundle", "z.bundle").unwrap_err();
    assert!(matches!(err, BundleError::Magic { .. }), "{err}");
    let err = Bundle::load(std::path::Path::new("missing.bundle")).unwrap_err();
    assert!(err.to_string().contains("missing.bundle"));
}

/// Without a GPU driver, opening a session is an error value, not a panic.
#[test]
fn no_driver_is_an_error() {
    if fusec::runtime::driver_available() {
        println!("skipped: this machine has a CUDA driver (tests/gpu.rs covers it)");
        return;
    }
    let err = Session::new(&bundle(), 0).err().expect("no session without a driver");
    assert!(matches!(err, RuntimeError::NoDriver), "{err}");
    assert!(err.to_string().contains("no CUDA driver"));
}

/// The range `batch=LO..HI`.
fn range(low: usize, high: usize) -> fusec::bundle::BundleRange {
    fusec::bundle::BundleRange::new("batch", low, high)
}

/// A header whose inputs or outputs lie outside the bundle's memory, or whose sizes overflow,
/// is an error naming the tensor before anything touches a GPU (with or without a driver).
#[test]
fn inputs_and_outputs_outside_the_bundles_memory_are_errors() {
    use fusec::ir::SymDim;
    use fusec::plan::Location;
    let good = bundle();
    let arena = good.header.arena_bytes;
    type Damage = Box<dyn Fn(&mut Bundle)>;
    let cases: Vec<(Damage, &str)> = vec![
        (Box::new(move |b| b.header.inputs[0].location = Location::Arena(arena)), "lies outside"),
        (Box::new(|b| b.header.outputs[0].location = Location::Weights(usize::MAX - 4)), "lies outside"),
        (Box::new(|b| b.header.inputs[0].shape = vec![1 << 40, 1 << 40]), "overflows"),
        (Box::new(|b| b.header.outputs[0].dtype = "f33".into()), "unknown type f33"),
        (Box::new(|b| b.header.inputs[0].location = Location::Weights(0)), "placed in the weights"),
        (
            Box::new(|b| {
                let rank = b.header.inputs[0].shape.len();
                b.header.inputs[0].dims = Some(vec![SymDim::new(1, vec![1]); rank]);
            }),
            "follows a range the bundle does not have",
        ),
        (
            Box::new(|b| {
                b.header.ranges = vec![range(1, 2)];
                b.header.inputs[0].dims = Some(vec![SymDim::new(1, vec![1]); 7]);
            }),
            "sizes for a shape of rank",
        ),
        (
            Box::new(|b| {
                b.header.ranges = vec![range(1, 3)];
                let mut dims = SymDim::lits(&b.header.inputs[0].shape);
                dims[0] = SymDim::new(1, vec![1]);
                b.header.inputs[0].dims = Some(dims);
            }),
            "which is not its shape",
        ),
        (Box::new(|b| b.header.ranges = vec![range(3, 2)]), "is not a range of sizes"),
    ];
    for (damage, needle) in cases {
        let mut b = good.clone();
        damage(&mut b);
        let err = Session::new(&b, 0).err().expect("a damaged header").to_string();
        assert!(err.contains(needle) && err.contains("the bundle's"), "'{needle}' not in: {err}");
    }
}

/// Every bundle output has the model's output type, also where the output is a reshape of a
/// value that lives elsewhere (it then shares that value's memory).
#[test]
fn bundle_outputs_have_the_model_output_types() {
    for file in common::all_fixtures() {
        let import = common::shape_variants(&file).remove(0);
        let model = fusec::import::import(&common::model_path(&file), &import).unwrap();
        for no_fuse in [false, true] {
            let options = CompileOptions { import: import.clone(), no_fuse, ..Default::default() };
            let bundle = fusec::compile(&common::model_path(&file), &options).unwrap();
            for ((name, id), spec) in model.graph.outputs().iter().zip(&bundle.header.outputs) {
                assert_eq!(&spec.name, name);
                assert_eq!(
                    spec.tensor_type().as_ref(),
                    Some(&model.graph.node(*id).ty),
                    "{file} {name} no_fuse={no_fuse}"
                );
            }
        }
    }
    // A model whose output is a reshape of its input: Flatten.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flatten.onnx");
    let bytes = std::fs::read(common::model_path("mlp_block.onnx")).unwrap();
    use prost::Message;
    let mut proto = tract_onnx::pb::ModelProto::decode(bytes.as_slice()).unwrap();
    let graph = proto.graph.as_mut().unwrap();
    graph.node.truncate(0);
    graph.node.push(tract_onnx::pb::NodeProto {
        name: "flat".into(),
        op_type: "Flatten".into(),
        input: vec!["x".into()],
        output: vec!["y".into()],
        ..Default::default()
    });
    graph.initializer.clear();
    graph.output[0].r#type = None;
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    let options = CompileOptions { import: ImportOptions::default().dim("batch", 2), ..Default::default() };
    let bundle = fusec::compile(&path, &options).unwrap();
    assert_eq!(bundle.header.outputs[0].shape, vec![2, 280]);
    assert_eq!(bundle.header.outputs[0].location, bundle.header.inputs[0].location);
    assert_eq!((bundle.header.kernels, bundle.header.launches), (0, 0));
}

/// The Rust API as the README shows it compiles (and, without a GPU, fails cleanly).
#[test]
fn readme_api_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.bundle");
    bundle().save(&path).unwrap();
    let path = path.to_str().unwrap();
    let inputs: Vec<(String, fusec::ir::Tensor)> = Vec::new();
    let result = (|| -> Result<Vec<(String, fusec::ir::Tensor)>, Box<dyn std::error::Error>> {
        Ok(fusec::Session::new(&fusec::Bundle::load(path)?, 0)?.run(&inputs)?)
    })();
    let err = result.expect_err("no inputs given (and maybe no GPU)").to_string();
    assert!(err.contains("no CUDA driver") || err.contains("was not given"), "{err}");
}

/// Seeded byte mutations and truncations of a bundle (not coverage-guided fuzzing): each is
/// refused with an error or loads, never panics.
#[test]
fn mutated_bundles_never_panic() {
    let bytes = bundle().to_bytes().unwrap();
    let mut next = common::xorshift(0x2545_F491_4F6C_DD1D);
    let mut panics = Vec::new();
    for case in 0..2000 {
        // The header's first bytes (magic, version, lengths) get most of the damage.
        let span = if case % 2 == 0 { 64.min(bytes.len()) } else { bytes.len() };
        let damaged = common::mutated(&bytes, &mut next, 3, span, case % 5 == 0);
        if std::panic::catch_unwind(|| Bundle::from_bytes(&damaged, "m.bundle").map(|_| ())).is_err() {
            panics.push(case);
        }
    }
    assert!(panics.is_empty(), "cases that panicked: {panics:?}");
}
