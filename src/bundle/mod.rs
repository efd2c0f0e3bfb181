//! The bundle: one file holding everything needed to run a compiled model.
//!
//! ```text
//! magic "FUSECBND" | format version (u32 LE) | header length (u64 LE) | header (JSON)
//! | weights length (u64 LE) | weights | checksum (u64 LE; [`bundle_checksum`] of the
//! bytes before the weights and of the weights)
//! ```
//!
//! The header holds the program (kernel sources, GEMM calls, memory locations), PTX per
//! kernel when NVRTC was available at compile time, and the inputs and outputs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::checksum::{self, words_checksum};
use crate::codegen::Step;
use crate::ir::SymDim;
use crate::ir::{DType, TensorType};
use crate::plan::Location;

/// The first eight bytes of every bundle.
pub const MAGIC: &[u8; 8] = b"FUSECBND";
/// The format version this fusec writes and reads (no other is read).
pub const FORMAT_VERSION: u32 = 12;

/// A bundle that cannot be written or read; each names the file (`path`).
#[derive(Debug, Error)]
pub enum BundleError {
    /// The file could not be read.
    #[error("{path}: cannot read the bundle: {source}")]
    Read {
        /// The bundle's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file could not be written.
    #[error("{path}: cannot write the bundle: {source}")]
    Write {
        /// The bundle's path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not start with [`MAGIC`].
    #[error("{path}: not a fusec bundle (bad magic)")]
    Magic {
        /// The bundle's path.
        path: String,
    },
    /// Another format version than [`FORMAT_VERSION`], older or newer.
    #[error("{path}: bundle format version {found}, this fusec reads version {FORMAT_VERSION}; recompile the model")]
    Version {
        /// The bundle's path.
        path: String,
        /// The version the file declares.
        found: u32,
    },
    /// The file ends before what its lengths declare.
    #[error("{path}: the bundle is truncated ({0})", .detail)]
    Truncated {
        /// The bundle's path.
        path: String,
        /// Which part is cut short.
        detail: String,
    },
    /// The bytes do not match the checksum at the end.
    #[error("{path}: checksum mismatch: the bundle is corrupted")]
    Checksum {
        /// The bundle's path.
        path: String,
    },
    /// The header is not valid JSON of the expected shape, or is inconsistent.
    #[error("{path}: bad header: {message}")]
    Header {
        /// The bundle's path.
        path: String,
        /// What is wrong with it.
        message: String,
    },
}

/// A graph input or output: name, type, and where it lives.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IoSpec {
    /// The ONNX graph's name for it.
    pub name: String,
    /// Its element type's name (`f32`, `i64`; [`DType::from_name`]).
    pub dtype: String,
    /// Its shape (at the top of the bundle's ranges, for one that has ranges).
    pub shape: Vec<usize>,
    /// Where it lives in the session's memory.
    pub location: Location,
    /// In a bundle for ranges of sizes, its shape as expressions of them (`None`: the shape
    /// is fixed).
    #[serde(default)]
    pub dims: Option<Vec<SymDim>>,
    /// For an input stored inside an output's buffer (a key/value cache updated in place):
    /// how its rows lie there. `None`: contiguous at `location`.
    #[serde(default)]
    pub inside: Option<crate::plan::Inside>,
}

impl IoSpec {
    /// The spec of `name`, of type `ty`, at `location`.
    pub fn new(name: &str, ty: &TensorType, location: Location) -> Self {
        IoSpec {
            name: name.to_string(),
            dtype: ty.dtype.name().to_string(),
            shape: ty.shape.clone(),
            location,
            dims: None,
            inside: None,
        }
    }

    /// The shape it takes, with the dims of `ranges` named where it follows them
    /// (`[batch, seq]`, `[batch*16, 64]`; `[8, 16]` for a fixed shape).
    pub fn shape_text(&self, ranges: &[BundleRange]) -> String {
        match &self.dims {
            Some(dims) if !ranges.is_empty() => {
                let dims: Vec<String> = dims.iter().map(|d| d.display(ranges)).collect();
                format!("[{}]", dims.join(", "))
            }
            _ => format!("{:?}", self.shape),
        }
    }

    /// Its shape at the point `values` of the bundle's ranges (its shape without ranges).
    pub fn shape_at(&self, values: &[usize]) -> Vec<usize> {
        match &self.dims {
            Some(dims) if !values.is_empty() => {
                dims.iter().zip(&self.shape).map(|(d, &top)| d.eval(values).unwrap_or(top)).collect()
            }
            _ => self.shape.clone(),
        }
    }

    /// The bytes it spans from its location: its size, or for an input stored inside an
    /// output ([`IoSpec::inside`]) its rows there (0 for an element type this fusec does not
    /// know).
    pub fn span_bytes(&self) -> usize {
        match &self.inside {
            Some(inside) => inside.span_bytes(),
            None => self.tensor_type().map_or(0, |t| t.size_bytes()),
        }
    }

    /// Its element type and shape (`None` for an element type this fusec does not know).
    pub fn tensor_type(&self) -> Option<TensorType> {
        Some(TensorType::new(DType::from_name(&self.dtype)?, self.shape.clone()))
    }
}

/// Checks `inputs` (by name) against a bundle's input `specs`: every input given and no
/// other, each of its element type and shape — for a bundle with `ranges`, at any point of
/// them, the same point for every input. Returns that point (the size of each range, in
/// order; empty without ranges). The error names the input; for a size outside a range, also
/// the axis, the range and the value given.
pub fn input_point(
    specs: &[IoSpec],
    ranges: &[BundleRange],
    inputs: &[(String, crate::ir::Tensor)],
) -> Result<Vec<usize>, String> {
    let given: Vec<GivenInput> =
        inputs.iter().map(|(name, t)| GivenInput { name, dtype: t.dtype(), shape: t.shape() }).collect();
    input_point_of(specs, ranges, &given)
}

/// What a caller gives for one input: its name, element type and shape (the data stays
/// where it is: host bytes, a device buffer).
#[derive(Clone, Copy, Debug)]
pub struct GivenInput<'a> {
    /// The input's name.
    pub name: &'a str,
    /// Its element type.
    pub dtype: crate::ir::DType,
    /// Its shape.
    pub shape: &'a [usize],
}

/// [`input_point`] for inputs described by name, type and shape.
pub fn input_point_of(
    specs: &[IoSpec],
    ranges: &[BundleRange],
    inputs: &[GivenInput],
) -> Result<Vec<usize>, String> {
    let expected = || {
        specs
            .iter()
            .map(|i| format!("{} {}{}", i.name, i.dtype, i.shape_text(ranges)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for GivenInput { name, .. } in inputs {
        if !specs.iter().any(|i| i.name == *name) {
            return Err(format!(
                "'{name}' is not an input of the model (its inputs: {}){}",
                expected(),
                crate::suggest::did_you_mean(name, specs.iter().map(|i| i.name.as_str()))
            ));
        }
    }
    let given = |spec: &IoSpec| {
        inputs
            .iter()
            .find(|g| g.name == spec.name)
            .ok_or_else(|| format!("input '{}' was not given (the inputs: {})", spec.name, expected()))
    };
    let wrong = |spec: &IoSpec, given: &GivenInput| {
        format!(
            "input '{}' is {}{:?}, the model takes {}{}",
            spec.name,
            given.dtype,
            given.shape,
            spec.dtype,
            spec.shape_text(ranges)
        )
    };
    // Each range's size, from the first input axis that is that dim alone (times a factor).
    let mut point: Vec<Option<(usize, &str)>> = vec![None; ranges.len()];
    for spec in specs {
        let given = given(spec)?;
        let dims = match &spec.dims {
            Some(dims) if !ranges.is_empty() => dims,
            _ => {
                if given.dtype.name() != spec.dtype || given.shape != spec.shape.as_slice() {
                    return Err(wrong(spec, given));
                }
                continue;
            }
        };
        if given.dtype.name() != spec.dtype || given.shape.len() != dims.len() {
            return Err(wrong(spec, given));
        }
        for (axis, (dim, &value)) in dims.iter().zip(given.shape).enumerate() {
            let Some(i) = dim.alone() else { continue };
            // A sum of others (`total=past+seq`) is its parts' sizes added, checked below.
            let Some(range) = ranges.get(i).filter(|r| !r.is_sum()) else { continue };
            let per = dim.factor.max(1);
            let n = value / per;
            if value % per != 0 || n < range.low || n > range.high {
                return Err(format!(
                    "input '{}' has {value} along axis {axis} ({}{}): {} must be in {}..{}, the bundle's range",
                    spec.name,
                    spec.dtype,
                    spec.shape_text(ranges),
                    range.symbol,
                    range.low,
                    range.high
                ));
            }
            match point[i] {
                Some((other, name)) if other != n => {
                    return Err(format!(
                        "input '{}' is at {}={n}, input '{name}' at {}={other}",
                        spec.name, range.symbol, range.symbol
                    ))
                }
                _ => point[i] = Some((n, spec.name.as_str())),
            }
        }
    }
    let point: Vec<usize> = point
        .iter()
        .zip(ranges)
        .map(|(v, r)| match v {
            Some((n, _)) => Ok(*n),
            None if r.is_sum() => Ok(0),
            None => Err(format!("no input of the model gives {}", r.symbol)),
        })
        .collect::<Result<_, _>>()?;
    let point = crate::ir::with_sums(ranges, &point)
        .ok_or_else(|| "the bundle's ranges name a sum of dims it does not have".to_string())?;
    // Every size of every input at that point (products of dims included).
    for spec in specs {
        let given = given(spec)?;
        if spec.dims.is_some() && given.shape != spec.shape_at(&point).as_slice() {
            return Err(wrong(spec, given));
        }
    }
    Ok(point)
}

/// The range of sizes of one dim a bundle runs.
pub type BundleRange = crate::ir::DimRange;

/// Everything in a bundle but the weights: the program and what it takes and gives.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// [`FORMAT_VERSION`] when written.
    pub format_version: u32,
    /// The ONNX file it was compiled from.
    pub model: String,
    /// Compiled with fusion (false: one kernel per ONNX node, `--no-fuse`).
    pub fused: bool,
    /// Storage type of weights and activations (inputs and outputs are f32 regardless).
    pub precision: DType,
    /// The program: kernel launches and GEMM calls, in order.
    pub steps: Vec<Step>,
    /// PTX by function (one for all the steps that run it), for `arch`.
    pub ptx: BTreeMap<String, String>,
    /// The GPU architecture the PTX is for (`sm_90`), if any was compiled.
    pub arch: Option<String>,
    /// The model's inputs, in order.
    pub inputs: Vec<IoSpec>,
    /// The model's outputs, in order.
    pub outputs: Vec<IoSpec>,
    /// Bytes of device memory for activations (inputs and outputs included).
    pub arena_bytes: usize,
    /// Kernels of the partition (a GEMM with its fused epilogue is one).
    pub kernels: usize,
    /// Launches one run issues: generated kernels plus cuBLAS calls (a GEMM whose epilogue
    /// cuBLASLt cannot run is two: the cuBLAS call and the epilogue kernel).
    pub launches: usize,
    /// cuBLAS / cuBLASLt calls one run makes.
    pub gemm_calls: usize,
    /// Points where the GPU program stops (none on every supported model).
    pub graph_breaks: usize,
    /// Estimated device-memory bytes one run moves ([`crate::plan::Plan::traffic_bytes`]).
    #[serde(default)]
    pub traffic_bytes: u64,
    /// Floating-point operations of one run's matrix products.
    #[serde(default)]
    pub flops: u64,
    /// The ranges of sizes the bundle runs (`--dim batch=1..32 --dim seq=1..512`), in name
    /// order: a point of them is the size of each, in this order. The shapes of the inputs
    /// and outputs that follow them are in `IoSpec::dims`; empty: one size.
    #[serde(default)]
    pub ranges: Vec<BundleRange>,
    /// What each code a kernel reports for an index outside its axis stands for (the gathering
    /// node, its indices and the axis): [`crate::codegen::index_checks`].
    #[serde(default)]
    pub index_checks: BTreeMap<u32, String>,
    /// The inputs whose values index a table directly, and the smallest such table's axis
    /// ([`crate::codegen::index_limits`]): what `fusec bench` draws them below.
    #[serde(default)]
    pub index_limits: BTreeMap<String, usize>,
}

impl Header {
    /// The cuDNN convolution calls of the program (a network's convolutions that did not run as
    /// generated loops).
    pub fn conv_calls(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s, Step::Conv { .. })).count()
    }
}

/// A compiled model: what `fusec compile` writes and a [`crate::Session`] runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Bundle {
    /// The program and its inputs and outputs.
    pub header: Header,
    /// The weights, laid out as the program reads them.
    pub weights: Vec<u8>,
}

/// The checksum a bundle ends with: of the bytes before the weights (magic, version,
/// header, lengths) and of the weights.
pub fn bundle_checksum(before_weights: &[u8], weights: &[u8]) -> u64 {
    (words_checksum(before_weights).rotate_left(17) ^ words_checksum(weights))
        .wrapping_mul(checksum::FNV_PRIME)
}

impl Bundle {
    /// Everything before the weights: magic, version, header length, header, weights length.
    fn prefix(&self) -> Result<Vec<u8>, BundleError> {
        let header = serde_json::to_vec(&self.header)
            .map_err(|e| BundleError::Header { path: String::new(), message: e.to_string() })?;
        let mut out = Vec::with_capacity(header.len() + 28);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(self.weights.len() as u64).to_le_bytes());
        Ok(out)
    }

    /// The bundle's file contents.
    pub fn to_bytes(&self) -> Result<Vec<u8>, BundleError> {
        let mut out = self.prefix()?;
        let sum = bundle_checksum(&out, &self.weights);
        out.reserve(self.weights.len() + 8);
        out.extend_from_slice(&self.weights);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Parses a bundle; `path` only names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Bundle, BundleError> {
        let path = path.to_string();
        let truncated =
            |detail: &str| BundleError::Truncated { path: path.clone(), detail: detail.to_string() };
        if bytes.len() < 8 || &bytes[..8] != MAGIC {
            return Err(BundleError::Magic { path });
        }
        let take = |at: usize, n: usize, what: &str| {
            at.checked_add(n).and_then(|end| bytes.get(at..end)).ok_or_else(|| truncated(what))
        };
        let version = u32::from_le_bytes(take(8, 4, "version")?.try_into().unwrap_or_default());
        if version != FORMAT_VERSION {
            return Err(BundleError::Version { path, found: version });
        }
        let header_len =
            u64::from_le_bytes(take(12, 8, "header length")?.try_into().unwrap_or_default()) as usize;
        let header_bytes = take(20, header_len, "header")?;
        let at = 20 + header_len;
        let weights_len =
            u64::from_le_bytes(take(at, 8, "weights length")?.try_into().unwrap_or_default()) as usize;
        let weights = take(at + 8, weights_len, "weights")?;
        let end = at + 8 + weights_len;
        let stored = u64::from_le_bytes(take(end, 8, "checksum")?.try_into().unwrap_or_default());
        if bytes.len() != end + 8 || bundle_checksum(&bytes[..at + 8], weights) != stored {
            return Err(BundleError::Checksum { path });
        }
        let header: Header = serde_json::from_slice(header_bytes)
            .map_err(|e| BundleError::Header { path: path.clone(), message: e.to_string() })?;
        Ok(Bundle { header, weights: weights.to_vec() })
    }

    /// Writes the bundle to `path`, the weights straight from memory (no second copy).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), BundleError> {
        use std::io::Write;
        let path = path.as_ref();
        let fail = |source| BundleError::Write { path: path.display().to_string(), source };
        let prefix = self.prefix()?;
        let sum = bundle_checksum(&prefix, &self.weights);
        let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(fail)?);
        file.write_all(&prefix).map_err(fail)?;
        file.write_all(&self.weights).map_err(fail)?;
        file.write_all(&sum.to_le_bytes()).map_err(fail)?;
        file.flush().map_err(fail)
    }

    /// Reads and checks the bundle at `path` (magic, version, lengths, checksum, header).
    pub fn load(path: impl AsRef<Path>) -> Result<Bundle, BundleError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| BundleError::Read { path: name.clone(), source })?;
        Bundle::from_bytes(&bytes, &name)
    }
}
