//! Bad input gives a clear error naming what is wrong, never a panic.

mod common;

use std::path::Path;

use fusec::import::{import, ImportError, ImportOptions, InputSpec};
use prost::Message;
use tract_onnx::pb::ModelProto;

fn bert_options() -> ImportOptions {
    ImportOptions::default().dim("batch", 2).dim("seq", 5)
}

fn import_err(path: &Path, options: &ImportOptions) -> (ImportError, String) {
    let err = import(path, options).expect_err("import must fail");
    let text = err.to_string();
    (err, text)
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn missing_file() {
    let (err, text) = import_err(Path::new("no/such/model.onnx"), &bert_options());
    assert!(matches!(err, ImportError::Read { .. }), "{text}");
    assert!(text.contains("no/such/model.onnx") && text.contains("cannot read"), "{text}");
}

#[test]
fn empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "empty.onnx", b"");
    let (err, text) = import_err(&path, &bert_options());
    assert!(matches!(err, ImportError::Empty { .. }), "{text}");
    assert!(text.contains("empty.onnx") && text.contains("empty"), "{text}");
}

#[test]
fn random_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // Deterministic noise that is not a protobuf message.
    let noise: Vec<u8> = (0u32..4096).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let path = write(&dir, "noise.onnx", &noise);
    let (err, text) = import_err(&path, &bert_options());
    assert!(matches!(err, ImportError::Decode { .. } | ImportError::NoGraph { .. }), "{text}");
    assert!(text.contains("noise.onnx"), "{text}");
}

#[test]
fn truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::model_path("bert_ts.onnx")).unwrap();
    let path = write(&dir, "truncated.onnx", &bytes[..bytes.len() / 2]);
    let (err, text) = import_err(&path, &bert_options());
    assert!(matches!(err, ImportError::Decode { .. }), "{text}");
    assert!(text.contains("truncated.onnx") && text.contains("truncated"), "{text}");
}

/// bert_ts.onnx with its first Erf node renamed to an op fusec does not know.
/// The fixture `file`, decoded for a test to break.
fn fixture_proto(file: &str) -> ModelProto {
    ModelProto::decode(std::fs::read(common::model_path(file)).unwrap().as_slice()).unwrap()
}

fn with_unsupported_op(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let mut proto = fixture_proto("bert_ts.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let node = graph.node.iter_mut().find(|n| n.op_type == "Erf").unwrap();
    node.op_type = "NonMaxSuppression".into();
    write(dir, "unsupported.onnx", &proto.encode_to_vec())
}

#[test]
fn unsupported_op_names_node_op_and_opset() {
    let dir = tempfile::tempdir().unwrap();
    let path = with_unsupported_op(&dir);
    let (err, text) = import_err(&path, &bert_options());
    assert!(matches!(err, ImportError::Unsupported { count: 1, .. }), "{text}");
    assert!(
        text.contains("NonMaxSuppression") && text.contains("opset 17") && text.contains("node '"),
        "{text}"
    );
}

#[test]
fn symbolic_dim_without_value() {
    let (err, text) =
        import_err(&common::model_path("bert_ts.onnx"), &ImportOptions::default().dim("batch", 2));
    assert!(matches!(err, ImportError::SymbolicDim { axis: 1, .. }), "{text}");
    assert!(text.contains("'seq'") && text.contains("--dim seq=N"), "{text}");
}

#[test]
fn input_the_model_lacks() {
    let spec: InputSpec = "input_ids:2x5:i64".parse().unwrap();
    let options = ImportOptions::new(vec![spec], vec![]);
    let (err, text) = import_err(&common::model_path("bert_ts.onnx"), &options);
    assert!(matches!(err, ImportError::UnknownInput { .. }), "{text}");
    assert!(text.contains("input_ids") && text.contains("inputs are: input"), "{text}");
}

#[test]
fn dim_the_model_lacks() {
    let options = ImportOptions::default().dim("batch", 2).dim("sequence", 5);
    let (err, text) = import_err(&common::model_path("bert_ts.onnx"), &options);
    assert!(matches!(err, ImportError::UnknownDim { .. }), "{text}");
    assert!(text.contains("sequence") && text.contains("batch, seq"), "{text}");
}

#[test]
fn wrong_rank() {
    let spec: InputSpec = "input:2x5x3".parse().unwrap();
    let (err, text) =
        import_err(&common::model_path("bert_ts.onnx"), &ImportOptions::new(vec![spec], vec![]));
    assert!(matches!(err, ImportError::InputShape { .. }), "{text}");
    assert!(text.contains("rank 3") && text.contains("rank 2"), "{text}");
}

#[test]
fn fixed_dim_contradicted() {
    let spec: InputSpec = "x:2x8x40".parse().unwrap();
    let (_, text) =
        import_err(&common::model_path("mlp_block.onnx"), &ImportOptions::new(vec![spec], vec![]));
    assert!(text.contains("fixes at 7"), "{text}");
}

#[test]
fn wrong_input_type() {
    let spec: InputSpec = "input:2x5:f32".parse().unwrap();
    let (_, text) = import_err(&common::model_path("bert_ts.onnx"), &ImportOptions::new(vec![spec], vec![]));
    assert!(text.contains("--input gives f32, the model declares i64"), "{text}");
}

/// A shape that the model's own ops reject (a 40-wide layer fed 41 wide) names the node.
#[test]
fn shape_error_names_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut proto = fixture_proto("mlp_block.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let w1 = graph.initializer.iter_mut().find(|t| t.name == "w1").unwrap();
    w1.dims[0] = 41;
    w1.raw_data.extend(std::iter::repeat_n(0u8, 96 * 4));
    let path = write(&dir, "bad_shape.onnx", &proto.encode_to_vec());
    let (err, text) = import_err(&path, &ImportOptions::default().dim("batch", 2));
    assert!(matches!(err, ImportError::Node { .. }), "{text}");
    assert!(text.contains("fc1_matmul") && text.contains("MatMul") && text.contains("opset 17"), "{text}");
}

/// A large initializer (read from the file, not the decoded protobuf) whose raw data does
/// not fit its shape is an error naming it.
#[test]
fn large_initializer_of_the_wrong_size_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut proto = fixture_proto("mlp_block.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let w1 = graph.initializer.iter_mut().find(|t| t.name == "w1").unwrap();
    w1.raw_data = vec![1; 70_001];
    let path = write(&dir, "bad_raw.onnx", &proto.encode_to_vec());
    let (err, text) = import_err(&path, &ImportOptions::default().dim("batch", 2));
    assert!(matches!(err, ImportError::Initializer { .. }), "{text}");
    assert!(text.contains("'w1'") && text.contains("70001 bytes"), "{text}");
}

#[test]
fn training_mode_dropout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut proto = fixture_proto("mlp_block.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let mut flag = graph.initializer.iter().find(|t| t.name == "ratio").unwrap().clone();
    flag.name = "training".into();
    flag.data_type = 9; // BOOL
    flag.raw_data = vec![1];
    graph.initializer.push(flag);
    graph.node.iter_mut().find(|n| n.op_type == "Dropout").unwrap().input.push("training".into());
    let path = write(&dir, "training.onnx", &proto.encode_to_vec());
    let (_, text) = import_err(&path, &ImportOptions::default().dim("batch", 2));
    assert!(text.contains("dropout") && text.contains("training_mode"), "{text}");
}

/// A graph 10,000 nodes deep (a chain of unary ops on one input) compiles — import, passes,
/// fusion, plan and code generation — without overflowing the stack of a test thread.
#[test]
fn a_chain_ten_thousand_nodes_deep_compiles() {
    let dir = tempfile::tempdir().unwrap();
    let mut proto = fixture_proto("gelu_tanh.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let template = graph.node[0].clone();
    let input = graph.input[0].name.clone();
    let output = graph.output[0].name.clone();
    graph.initializer.clear();
    graph.node.clear();
    const DEPTH: usize = 10_000;
    for i in 0..DEPTH {
        let mut node = template.clone();
        node.op_type = ["Tanh", "Neg", "Abs", "Sigmoid"][i % 4].into();
        node.name = format!("n{i}");
        node.input = vec![if i == 0 { input.clone() } else { format!("t{}", i - 1) }];
        node.output = vec![if i + 1 == DEPTH { output.clone() } else { format!("t{i}") }];
        node.attribute.clear();
        graph.node.push(node);
    }
    let path = write(&dir, "deep.onnx", &proto.encode_to_vec());
    let options = fusec::CompileOptions {
        import: ImportOptions::default().dim("batch", 2),
        arch: None,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let bundle = fusec::compile(&path, &options).unwrap_or_else(|e| panic!("{e}"));
    assert!(bundle.header.kernels >= 1, "{:?}", bundle.header.kernels);
    println!(
        "10,000-deep chain: {} kernels in {:.1} s",
        bundle.header.kernels,
        started.elapsed().as_secs_f64()
    );
}

/// External data is read only from inside the model's directory: a location with `..`, an
/// absolute one, or a symbolic link that points out is refused with the file, the initializer
/// and the location named; the same bytes in a file beside the model load.
#[test]
fn external_data_must_stay_in_the_models_directory() {
    use tract_onnx::pb::StringStringEntryProto;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    let mut proto = fixture_proto("mlp_block.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let w1 = graph.initializer.iter_mut().find(|t| t.name == "w1").unwrap();
    let bytes = std::mem::take(&mut w1.raw_data);
    w1.data_location = Some(1);
    std::fs::write(dir.join("w1.bin"), &bytes).unwrap();
    std::fs::write(root.path().join("outside.bin"), &bytes).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(root.path().join("outside.bin"), dir.join("link.bin")).unwrap();
    let options = ImportOptions::default().dim("batch", 2);
    let with_location = |location: &str| {
        let mut proto = proto.clone();
        let w1 = proto.graph.as_mut().unwrap().initializer.iter_mut().find(|t| t.name == "w1").unwrap();
        w1.external_data = vec![StringStringEntryProto { key: "location".into(), value: location.into() }];
        let path = dir.join("m.onnx");
        std::fs::write(&path, proto.encode_to_vec()).unwrap();
        path
    };
    let outside = root.path().join("outside.bin");
    let mut refused =
        vec!["../outside.bin".to_string(), outside.display().to_string(), "a/../../outside.bin".into()];
    if cfg!(unix) {
        refused.push("link.bin".into());
    }
    for location in &refused {
        let (err, text) = import_err(&with_location(location), &options);
        assert!(matches!(err, ImportError::Initializer { .. }), "{location}: {text}");
        let why =
            text.contains("outside the model's directory") || text.contains("leaves the model's directory");
        assert!(text.contains("m.onnx") && text.contains("'w1'") && why, "{location}: {text}");
        println!("{location}: {text}");
    }
    let model = import(&with_location("w1.bin"), &options).unwrap_or_else(|e| panic!("{e}"));
    let inside = model.graph.node_ids().find(|&id| model.graph.node(id).name == "w1").unwrap();
    let reference = import(&common::model_path("mlp_block.onnx"), &options).unwrap();
    let original = reference.graph.node_ids().find(|&id| reference.graph.node(id).name == "w1").unwrap();
    assert_eq!(
        model.graph.constant(inside).unwrap().to_f64_vec(),
        reference.graph.constant(original).unwrap().to_f64_vec()
    );
}

/// What a file or a command line can make the import allocate is capped: a ConstantOfShape
/// asking for 2^60 elements and an input dim of 2^62 are clear errors naming the node or the
/// input, not an allocation failure or an overflowed size.
#[test]
fn huge_declared_sizes_are_errors_not_allocations() {
    use tract_onnx::pb::{NodeProto, TensorProto};
    let dir = tempfile::tempdir().unwrap();
    let mut proto = fixture_proto("mlp_block.onnx");
    let graph = proto.graph.as_mut().unwrap();
    let dims: Vec<u8> = [1i64 << 30, 1i64 << 30].iter().flat_map(|d| d.to_le_bytes()).collect();
    graph.initializer.push(TensorProto {
        name: "huge_shape".into(),
        dims: vec![2],
        data_type: 7, // INT64
        raw_data: dims,
        ..Default::default()
    });
    graph.node.push(NodeProto {
        name: "make_huge".into(),
        op_type: "ConstantOfShape".into(),
        input: vec!["huge_shape".into()],
        output: vec!["huge".into()],
        ..Default::default()
    });
    let path = write(&dir, "huge.onnx", &proto.encode_to_vec());
    let (_, text) = import_err(&path, &ImportOptions::default().dim("batch", 2));
    assert!(text.contains("huge.onnx") && text.contains("make_huge") && text.contains("elements"), "{text}");
    let (_, text) =
        import_err(&common::model_path("mlp_block.onnx"), &ImportOptions::default().dim("batch", 1 << 62));
    assert!(text.contains("input 'x'") && text.contains("elements an input may have"), "{text}");
}

/// Raw bytes of an element type the loader cannot read (string, complex, bfloat16, …), or dims
/// whose byte count overflows, in a `.pb` input file or as a model's initializer: an error
/// naming the file, not a process stopped inside tract. The `.pb` cases are what the
/// `tensor_file` fuzz target found (`tests/fuzz_regressions/`).
#[test]
fn raw_data_of_an_unreadable_element_type_is_an_error() {
    use tract_onnx::pb::TensorProto;
    // What the fuzz target found: raw bytes of an unreadable type, and dims whose product
    // overflows before a 0 among them makes it 0.
    for found in ["tensor_file-raw-of-unreadable-type.pb", "tensor_file-dims-overflow-before-zero.pb"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions").join(found);
        let err = fusec::tensor_io::read_tensor(&path).unwrap_err().to_string();
        assert!(err.contains(found), "{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    for data_type in [8, 14, 15, 16, 17, 21] {
        let proto = TensorProto { dims: vec![2], data_type, raw_data: vec![1; 16], ..Default::default() };
        let file = write(&dir, &format!("t{data_type}.pb"), &proto.encode_to_vec());
        let err = fusec::tensor_io::read_tensor(&file).unwrap_err().to_string();
        assert!(err.contains(&format!("t{data_type}.pb")), "{err}");
        let mut model = fixture_proto("mlp_block.onnx");
        let graph = model.graph.as_mut().unwrap();
        let weight = graph.initializer.iter_mut().max_by_key(|t| t.raw_data.len()).unwrap();
        weight.data_type = data_type;
        let name = weight.name.clone();
        let path = write(&dir, &format!("m{data_type}.onnx"), &model.encode_to_vec());
        let (_, text) = import_err(&path, &ImportOptions::default().dim("batch", 2));
        assert!(text.contains(&format!("m{data_type}.onnx")) && text.contains(&name), "{text}");
    }
}

/// Seeded byte mutations of a fixture (not coverage-guided fuzzing): each damaged file gives a
/// result or an error, never a panic.
#[test]
fn mutated_model_files_never_panic() {
    let original = std::fs::read(common::model_path("mlp_block.onnx")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut next = common::xorshift(0x9E37_79B9_7F4A_7C15);
    let mut panics = Vec::new();
    for case in 0..400 {
        let bytes = common::mutated(&original, &mut next, 4, original.len(), case % 7 == 0);
        let path = write(&dir, &format!("m{case}.onnx"), &bytes);
        let outcome = std::panic::catch_unwind(|| {
            let _ = fusec::compile(
                &path,
                &fusec::CompileOptions {
                    import: ImportOptions::default().dim("batch", 2),
                    arch: None,
                    ..Default::default()
                },
            );
        });
        if outcome.is_err() {
            panics.push(case);
        }
    }
    assert!(panics.is_empty(), "cases that panicked: {panics:?}");
}
