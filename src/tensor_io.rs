//! Tensor files: numpy `.npy` (read and write) and ONNX `TensorProto` `.pb` (read), as the
//! ONNX backend test data uses.

use std::path::Path;

use prost::Message;
use thiserror::Error;

use crate::ir::{DType, Tensor};

/// A tensor file that cannot be read or written.
#[derive(Debug, Error)]
#[error("{path}: {message}")]
pub struct TensorFileError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

fn fail(path: &Path, message: impl Into<String>) -> TensorFileError {
    TensorFileError { path: path.display().to_string(), message: message.into() }
}

fn npy_descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 => "<V2",
        DType::F64 => "<f8",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::Bool => "|b1",
    }
}

/// Reads a tensor from `.npy` or `.pb` (by extension).
pub fn read_tensor(path: &Path) -> Result<Tensor, TensorFileError> {
    let bytes = std::fs::read(path).map_err(|e| fail(path, format!("cannot read: {e}")))?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => parse_npy(&bytes).map_err(|m| fail(path, m)),
        Some("pb") => {
            let proto = tract_onnx::pb::TensorProto::decode(bytes.as_slice())
                .map_err(|e| fail(path, format!("not an ONNX TensorProto: {e}")))?;
            // As the import reads initializers: external data only beside the file, only
            // element types whose bytes can be read.
            crate::import::tensor_from_proto(&proto, path).map_err(|m| fail(path, m))
        }
        _ => Err(fail(path, "unknown tensor file type: expected .npy or .pb")),
    }
}

fn parse_npy(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        _ => return Err("truncated .npy header".into()),
    };
    let header = std::str::from_utf8(bytes.get(start..start + header_len).ok_or("truncated .npy header")?)
        .map_err(|_| "the .npy header is not text")?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        Some(header[at..].trim_start_matches([':', ' ']))
    };
    if field("fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err("Fortran-ordered .npy arrays are not supported".into());
    }
    let descr = field("descr")
        .and_then(|v| v.strip_prefix('\'')?.split('\'').next())
        .ok_or("no descr in .npy header")?;
    let dtype = [DType::F32, DType::F16, DType::F64, DType::I64, DType::I32, DType::Bool]
        .into_iter()
        .find(|&d| npy_descr(d) == descr || (d == DType::Bool && descr == "?"))
        .ok_or_else(|| format!(".npy element type {descr} is not supported"))?;
    let shape_text = field("shape")
        .and_then(|v| v.strip_prefix('(')?.split(')').next())
        .ok_or("no shape in .npy header")?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("bad .npy shape ({shape_text})")))
        .collect::<Result<_, _>>()?;
    let data = &bytes[start + header_len..];
    let count: usize = shape.iter().product();
    if data.len() != count * dtype.size_bytes() {
        return Err(format!("{} data bytes for shape {shape:?} of {dtype}", data.len()));
    }
    Tensor::from_le_bytes(data, &shape, dtype).ok_or_else(|| format!("bad .npy data for shape {shape:?}"))
}

/// Writes `tensor` as a `.npy` file.
pub fn write_npy(path: &Path, tensor: &Tensor) -> Result<(), TensorFileError> {
    let shape: Vec<String> = tensor.shape().iter().map(|d| d.to_string()).collect();
    let shape = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}", npy_descr(tensor.dtype()));
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    tensor.append_le_bytes(&mut out);
    std::fs::write(path, out).map_err(|e| fail(path, format!("cannot write: {e}")))
}

/// One data set of an ONNX backend test case: inputs and expected outputs, in order.
pub type DataSet = (Vec<Tensor>, Vec<Tensor>);

/// The data sets of a test case in the ONNX backend layout: `dir/test_data_set_N/input_K.pb`
/// and `output_K.pb`.
pub fn read_test_data_sets(dir: &Path) -> Result<Vec<DataSet>, TensorFileError> {
    let numbered = |dir: &Path, prefix: &str| -> Result<Vec<std::path::PathBuf>, TensorFileError> {
        let mut found: Vec<(usize, std::path::PathBuf)> = std::fs::read_dir(dir)
            .map_err(|e| fail(dir, format!("cannot list: {e}")))?
            .filter_map(|e| {
                let path = e.ok()?.path();
                let name = path.file_name()?.to_str()?.to_string();
                let n = name.strip_prefix(prefix)?.trim_end_matches(".pb").parse().ok()?;
                Some((n, path))
            })
            .collect();
        found.sort();
        Ok(found.into_iter().map(|(_, p)| p).collect())
    };
    numbered(dir, "test_data_set_")?
        .iter()
        .map(|set| {
            let inputs = numbered(set, "input_")?.iter().map(|p| read_tensor(p)).collect::<Result<_, _>>()?;
            let outputs =
                numbered(set, "output_")?.iter().map(|p| read_tensor(p)).collect::<Result<_, _>>()?;
            Ok((inputs, outputs))
        })
        .collect()
}

/// The `(rtol, atol)` a test case directory's `tolerance.json` gives, if it has one.
pub fn read_tolerance(dir: &Path) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(dir.join("tolerance.json")).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some((value["rtol"].as_f64()?, value["atol"].as_f64()?))
}

/// numpy's `allclose` (`|a − b| ≤ atol + rtol·|b|` everywhere, NaN equal to NaN), exact for
/// integers and booleans; false if shapes or types differ.
pub fn allclose(actual: &Tensor, expected: &Tensor, rtol: f64, atol: f64) -> bool {
    if actual.shape() != expected.shape() || actual.dtype() != expected.dtype() {
        return false;
    }
    if !expected.dtype().is_float() {
        return actual.to_i64() == expected.to_i64();
    }
    let (a, b) = (actual.to_f64(), expected.to_f64());
    a.iter()
        .zip(b.iter())
        .all(|(&x, &y)| (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= atol + rtol * y.abs())
}

/// The comparison `fusec run DIR` makes of a whole model's output with its expected one when
/// the directory gives no `tolerance.json`: numpy's `allclose` with `rtol` 1e-3 and an `atol` of
/// 1e-5 times the output's largest expected magnitude (at least 1e-7). A model's fp32 output
/// legitimately differs from another runtime's in the last bits of its largest values, which
/// ONNX's single-op default (`atol` 1e-7) calls wrong.
pub fn model_tolerance(expected: &Tensor) -> (f64, f64) {
    let largest = if expected.dtype().is_float() {
        expected.to_f64().iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()))
    } else {
        0.0
    };
    (1e-3, (1e-5 * largest).max(1e-7))
}

/// The element of `actual` furthest outside `atol + rtol·|expected|` (or, when all are
/// inside, closest to the edge): its index, our value and the expected one. `None` when the
/// shapes differ or the tensors are empty.
pub fn worst_element(
    actual: &Tensor,
    expected: &Tensor,
    rtol: f64,
    atol: f64,
) -> Option<(Vec<usize>, f64, f64)> {
    if actual.shape() != expected.shape() {
        return None;
    }
    let (a, b) = (actual.to_f64(), expected.to_f64());
    let excess = |x: f64, y: f64| {
        if (x.is_nan() && y.is_nan()) || x == y {
            f64::NEG_INFINITY
        } else if x.is_nan() || y.is_nan() {
            f64::INFINITY
        } else {
            (x - y).abs() - (atol + rtol * y.abs())
        }
    };
    let (index, _) = a
        .indexed_iter()
        .map(|(index, &x)| {
            let e = excess(x, b[&index]);
            (index, e)
        })
        .max_by(|l, r| l.1.total_cmp(&r.1))?;
    Some((ndarray::Dimension::slice(&index).to_vec(), a[&index], b[&index]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    /// A whole model's output 4e-6 away from the expected one (on an element near 0, where
    /// the single-op `atol` 1e-7 alone applies) passes; 1e-2 away does not, and the worst
    /// element is the one reported.
    #[test]
    fn model_outputs_are_compared_at_their_scale() {
        let expected =
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![0.9, -1.2, 0.0, 0.5]).unwrap());
        let (rtol, atol) = model_tolerance(&expected);
        assert!((atol - 1.2e-5).abs() < 1e-9, "{atol}");
        let near = Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![0.900004, -1.200004, 4e-6, 0.5]).unwrap(),
        );
        assert!(allclose(&near, &expected, rtol, atol));
        assert!(!allclose(&near, &expected, 1e-3, 1e-7), "the single-op default would call it wrong");
        let far = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![0.9, -1.2, 0.01, 0.5]).unwrap());
        assert!(!allclose(&far, &expected, rtol, atol));
        let (index, ours, want) = worst_element(&far, &expected, rtol, atol).unwrap();
        assert_eq!(index, vec![1, 0]);
        assert!((ours - 0.01).abs() < 1e-6 && want == 0.0);
        assert_eq!(
            model_tolerance(&Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1]), vec![5]).unwrap())).1,
            1e-7
        );
    }

    #[test]
    fn npy_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.npy");
        let t = Tensor::F32(
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, -2.5, 3.0, 0.25, 5.0, 6.0]).unwrap(),
        );
        write_npy(&path, &t).unwrap();
        assert_eq!(read_tensor(&path).unwrap(), t);
        let ids = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[3]), vec![1, 7, 511]).unwrap());
        write_npy(&path, &ids).unwrap();
        assert_eq!(read_tensor(&path).unwrap(), ids);
    }
}
