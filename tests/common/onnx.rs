//! Small ONNX models written by the tests themselves: nodes, attributes, initializers, one
//! f32 input `x`.

use std::path::{Path, PathBuf};

use prost::Message;
use tract_onnx::pb::{
    attribute_proto::AttributeType, tensor_shape_proto, type_proto, AttributeProto, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

pub fn ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: values.to_vec(),
        r#type: AttributeType::Ints as i32,
        ..Default::default()
    }
}

pub fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i: value, r#type: AttributeType::Int as i32, ..Default::default() }
}

pub fn float(name: &str, value: f32) -> AttributeProto {
    AttributeProto { name: name.into(), f: value, r#type: AttributeType::Float as i32, ..Default::default() }
}

pub fn node(op: &str, inputs: &[&str], output: &str, attributes: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        name: format!("{op}_{output}"),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute: attributes,
        ..Default::default()
    }
}

/// An f32 initializer of `dims` with seeded values in [lo, lo + span).
pub fn weight(name: &str, dims: &[i64], seed: u64, lo: f32, span: f32) -> TensorProto {
    let mut next = super::xorshift(seed);
    let count: i64 = dims.iter().product();
    let values: Vec<f32> = (0..count).map(|_| lo + span * (next() % 10_000) as f32 / 10_000.0).collect();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

pub fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = |d: i64| tensor_shape_proto::Dimension {
        value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
        ..Default::default()
    };
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(TensorShapeProto { dim: dims.iter().map(|&d| dim(d)).collect() }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn write_model(
    dir: &Path,
    name: &str,
    input: &[i64],
    nodes: Vec<NodeProto>,
    init: Vec<TensorProto>,
) -> std::path::PathBuf {
    let output = nodes.last().unwrap().output[0].clone();
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 18 }],
        graph: Some(GraphProto {
            name: name.into(),
            node: nodes,
            initializer: init,
            input: vec![value_info("x", input)],
            output: vec![ValueInfoProto { name: output, ..Default::default() }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = dir.join(format!("{name}.onnx"));
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

/// An int64 initializer of `values` (1-D).
pub fn int64s(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: 7,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

/// An f32 initializer of `values` (1-D).
pub fn floats(name: &str, values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: 1,
        float_data: values.to_vec(),
        ..Default::default()
    }
}

/// A string attribute.
pub fn string(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: value.as_bytes().to_vec(),
        r#type: AttributeType::String as i32,
        ..Default::default()
    }
}

/// `rows` rows of `width` as a transformer block's second half: `h = x + x·w0`, its LayerNorm,
/// a product `inner` wide with a bias, one back with the residual `h`.
pub fn normed_block(dir: &Path, rows: i64, width: i64, inner: i64) -> PathBuf {
    let nodes = vec![
        node("MatMul", &["x", "w0"], "y", vec![]),
        node("Add", &["x", "y"], "h", vec![]),
        node(
            "LayerNormalization",
            &["h", "gamma", "beta"],
            "n",
            vec![int("axis", -1), float("epsilon", 1e-5)],
        ),
        node("MatMul", &["n", "w1"], "z1", vec![]),
        node("Add", &["z1", "b1"], "z", vec![]),
        node("MatMul", &["z", "w2"], "o", vec![]),
        node("Add", &["o", "h"], "out", vec![]),
    ];
    let init = vec![
        weight("w0", &[width, width], 81, -0.1, 0.2),
        weight("gamma", &[width], 82, 0.5, 1.0),
        weight("beta", &[width], 83, -0.5, 1.0),
        weight("w1", &[width, inner], 84, -0.2, 0.4),
        weight("b1", &[inner], 85, -0.3, 0.6),
        weight("w2", &[inner, width], 86, -0.2, 0.4),
    ];
    write_model(dir, &format!("normed{rows}_{width}_{inner}"), &[rows, width], nodes, init)
}
