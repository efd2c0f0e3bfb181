//! Large initializers read straight from the file, not through the decoded protobuf.
//!
//! Decoding a whole ONNX file with prost copies every weight into the message, so an import
//! held the file's bytes, the decoded copy and the IR's tensors at once. Instead the file is
//! memory-mapped, and one walk over its protobuf wire format writes a copy of the model
//! without the `raw_data` of large initializers (`ModelProto.graph` (7) →
//! `GraphProto.initializer` (5) → `TensorProto.raw_data` (9)), noting where each one's bytes
//! are in the file. The small remainder is decoded as usual; each large initializer becomes an
//! IR tensor from its bytes in the mapping, whose pages are then released.

use std::ops::Range;

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

use crate::ir::Tensor;

/// `raw_data` at least this long is left out of the decoded message and read from the file.
pub const MIN_STRIPPED: usize = 64 << 10;

const MODEL_GRAPH: u64 = 7;
const GRAPH_INITIALIZER: u64 = 5;
const TENSOR_RAW_DATA: u64 = 9;

/// The model's bytes without the `raw_data` of large initializers, and for each initializer
/// of the (first) graph in order, where its left-out `raw_data` is in `bytes`.
pub struct Stripped {
    pub model: Vec<u8>,
    pub raw: Vec<Option<Range<usize>>>,
}

/// Walks `bytes` (a serialised `ModelProto`). Errors name what is malformed; a file that is
/// not protobuf at all fails here as it would in the decoder.
pub fn strip(bytes: &[u8]) -> Result<Stripped, String> {
    let mut raw = Vec::new();
    let mut model = Vec::with_capacity(bytes.len().min(1 << 20));
    let mut graphs = 0;
    for field in Fields::new(bytes, 0) {
        let field = field?;
        if field.number == MODEL_GRAPH && field.wire == 2 && graphs == 0 {
            graphs += 1;
            let graph = strip_graph(bytes, field.payload.clone(), &mut raw)?;
            put_len_delimited(&mut model, field.number, &graph);
        } else {
            model.extend_from_slice(&bytes[field.whole]);
        }
    }
    Ok(Stripped { model, raw })
}

fn strip_graph(
    bytes: &[u8],
    span: Range<usize>,
    raw: &mut Vec<Option<Range<usize>>>,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for field in Fields::new(&bytes[span.clone()], span.start) {
        let field = field?;
        if field.number == GRAPH_INITIALIZER && field.wire == 2 {
            let (tensor, data) = strip_tensor(bytes, field.payload.clone())?;
            raw.push(data);
            put_len_delimited(&mut out, field.number, &tensor);
        } else {
            out.extend_from_slice(&bytes[field.whole]);
        }
    }
    Ok(out)
}

fn strip_tensor(bytes: &[u8], span: Range<usize>) -> Result<(Vec<u8>, Option<Range<usize>>), String> {
    let mut out = Vec::new();
    let mut data = None;
    for field in Fields::new(&bytes[span.clone()], span.start) {
        let field = field?;
        if field.number == TENSOR_RAW_DATA && field.wire == 2 && field.payload.len() >= MIN_STRIPPED {
            // The last occurrence wins in protobuf; an earlier one is dropped with it.
            data = Some(field.payload);
        } else {
            out.extend_from_slice(&bytes[field.whole]);
        }
    }
    Ok((out, data))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_len_delimited(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    put_varint(out, number << 3 | 2);
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// One field of a message: its number, wire type, the span of the whole field (key
/// included) and of its payload (for length-delimited fields, the bytes inside), as offsets
/// into the file.
#[derive(Debug)]
struct Field {
    number: u64,
    wire: u8,
    whole: Range<usize>,
    payload: Range<usize>,
}

/// The fields of the message in `bytes`, which starts at offset `base` of the file.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
    base: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8], base: usize) -> Self {
        Fields { bytes, at: 0, base, failed: false }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at).ok_or("a field runs past the end of the file")?;
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("a varint longer than 10 bytes at offset {}", self.base + self.at))
    }

    fn field(&mut self) -> Result<Field, String> {
        let start = self.at;
        let key = self.varint()?;
        let (number, wire) = (key >> 3, (key & 7) as u8);
        let payload_start = self.at;
        let payload_end = match wire {
            0 => self.varint().map(|_| self.at)?,
            1 => self.at + 8,
            5 => self.at + 4,
            2 => {
                let len = self.varint()?;
                let start = self.at;
                usize::try_from(len).ok().and_then(|l| start.checked_add(l)).ok_or_else(|| {
                    format!("a field of {len} bytes at offset {} is larger than the file", self.base + start)
                })?
            }
            other => {
                return Err(format!("wire type {other} at offset {} (not ONNX protobuf)", self.base + start))
            }
        };
        if payload_end > self.bytes.len() {
            return Err(format!(
                "field {number} at offset {} runs past the end of its message ({} bytes short): is the file truncated?",
                self.base + start,
                payload_end - self.bytes.len()
            ));
        }
        let payload = if wire == 2 { self.at..payload_end } else { payload_start..payload_end };
        self.at = payload_end;
        Ok(Field {
            number,
            wire,
            whole: self.base + start..self.base + payload_end,
            payload: self.base + payload.start..self.base + payload.end,
        })
    }
}

impl Iterator for Fields<'_> {
    type Item = Result<Field, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.bytes.len() {
            return None;
        }
        let field = self.field();
        self.failed = field.is_err();
        Some(field)
    }
}

/// The IR tensor of an initializer of ONNX type `data_type` and shape `dims` whose raw
/// little-endian bytes are `bytes`; `None` for element types read the general way.
pub fn tensor(data_type: i32, dims: &[i64], bytes: &[u8]) -> Option<Result<Tensor, String>> {
    fn array<T, const N: usize>(
        shape: Vec<usize>,
        bytes: &[u8],
        from: impl Fn([u8; N]) -> T,
    ) -> Result<ArrayD<T>, String> {
        let count: usize = shape.iter().product();
        if bytes.len() != count * N {
            return Err(format!(
                "raw data holds {} bytes, but shape {shape:?} needs {} ({count} elements of {N} bytes)",
                bytes.len(),
                count * N
            ));
        }
        let values = bytes.chunks_exact(N).map(|c| from(c.try_into().unwrap_or([0; N]))).collect();
        ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|e| e.to_string())
    }
    let shape = match dims.iter().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>() {
        Ok(shape) => shape,
        Err(_) => return Some(Err(format!("negative dimension in {dims:?}"))),
    };
    Some(match data_type {
        1 => array(shape, bytes, f32::from_le_bytes).map(Tensor::F32),
        10 => array(shape, bytes, |b| f16::from_bits(u16::from_le_bytes(b))).map(Tensor::F16),
        16 => array(shape, bytes, |b| bf16::from_bits(u16::from_le_bytes(b))).map(Tensor::BF16),
        11 => array(shape, bytes, f64::from_le_bytes).map(Tensor::F64),
        7 => array(shape, bytes, i64::from_le_bytes).map(Tensor::I64),
        6 => array(shape, bytes, i32::from_le_bytes).map(Tensor::I32),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_lengths_are_checked() {
        let mut out = Vec::new();
        put_len_delimited(&mut out, 7, &[1, 2, 3]);
        put_varint(&mut out, 300 << 3);
        put_varint(&mut out, 1 << 40);
        let fields: Vec<Field> = Fields::new(&out, 0).collect::<Result<_, _>>().unwrap();
        assert_eq!(fields.len(), 2);
        assert_eq!((fields[0].number, fields[0].wire, fields[0].payload.clone()), (7, 2, 2..5));
        assert_eq!((fields[1].number, fields[1].wire), (300, 0));
        assert_eq!(fields[1].whole.end, out.len());
        // A length beyond the message is an error, not a panic.
        let mut bad = Vec::new();
        put_varint(&mut bad, 7 << 3 | 2);
        put_varint(&mut bad, 1000);
        bad.extend_from_slice(&[0; 10]);
        let err = Fields::new(&bad, 0).collect::<Result<Vec<_>, _>>().unwrap_err();
        assert!(err.contains("runs past the end"), "{err}");
    }

    /// The stripped model decodes to the whole model with the large `raw_data` emptied, and
    /// each range holds exactly the bytes left out; small initializers stay inline.
    #[test]
    fn stripping_leaves_out_large_raw_data_only() {
        use prost::Message;
        use tract_onnx::pb::{GraphProto, ModelProto, NodeProto, TensorProto};
        let tensor = |name: &str, n: usize| TensorProto {
            name: name.into(),
            dims: vec![n as i64],
            data_type: 1,
            raw_data: (0..4 * n).map(|i| (i * 7 % 251) as u8).collect(),
            doc_string: "after the data".into(),
            ..Default::default()
        };
        let model = ModelProto {
            ir_version: 8,
            producer_name: "test".into(),
            graph: Some(GraphProto {
                name: "g".into(),
                initializer: vec![tensor("big", 20_000), tensor("small", 3), tensor("big2", 17_000)],
                node: vec![NodeProto { op_type: "Relu".into(), ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = model.encode_to_vec();
        let stripped = strip(&bytes).unwrap();
        assert!(stripped.model.len() < 1000, "{} bytes left", stripped.model.len());
        let decoded = ModelProto::decode(stripped.model.as_slice()).unwrap();
        let mut expected = model.clone();
        let graph = expected.graph.as_mut().unwrap();
        for (i, t) in graph.initializer.iter_mut().enumerate() {
            match &stripped.raw[i] {
                Some(range) => {
                    assert_eq!(&bytes[range.clone()], t.raw_data.as_slice(), "{}", t.name);
                    t.raw_data.clear();
                }
                None => assert_eq!(t.name, "small"),
            }
        }
        assert_eq!(decoded, expected);
        // Truncated files fail with an error, wherever they are cut.
        for cut in [1, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(strip(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn raw_bytes_of_the_wrong_size_are_refused() {
        let err = tensor(1, &[2, 3], &[0; 20]).unwrap().unwrap_err();
        assert!(err.contains("20 bytes") && err.contains("24"), "{err}");
        let t = tensor(1, &[2], &[0, 0, 128, 63, 0, 0, 0, 64]).unwrap().unwrap();
        assert_eq!(t, Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0, 2.0]).unwrap()));
        assert!(tensor(2, &[4], &[0; 4]).is_none(), "u8 goes the general way");
    }
}
