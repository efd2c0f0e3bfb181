//! What the user says about input shapes: `--input NAME:8x128[:i64]` and `--dim batch=8`.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::ir::DType;

/// A concrete shape (and optionally the element type) for one named input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    /// The input's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its element type, where given (`input_ids:8x128:i64`).
    pub dtype: Option<DType>,
}

impl FromStr for InputSpec {
    type Err = String;

    /// `NAME:8x128` or `NAME:8x128:i64`; a scalar is `NAME:` with an empty shape.
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("'{s}' is not NAME:DIMxDIM[:TYPE], e.g. input_ids:8x128:i64");
        let mut parts = s.rsplitn(3, ':').collect::<Vec<_>>();
        parts.reverse();
        let (name, dims, dtype) = match parts.as_slice() {
            [name, dims] => (*name, *dims, None),
            [name, dims, ty] => {
                let dtype = DType::from_name(ty).ok_or_else(|| {
                    format!("unknown element type '{ty}' in '{s}' (f32, f16, bf16, f64, i64, i32, bool)")
                })?;
                (*name, *dims, Some(dtype))
            }
            _ => return Err(usage()),
        };
        if name.is_empty() {
            return Err(usage());
        }
        let shape = if dims.is_empty() {
            vec![]
        } else {
            dims.split('x').map(|d| d.parse::<usize>().map_err(|_| usage())).collect::<Result<Vec<_>, _>>()?
        };
        if shape.contains(&0) {
            return Err(format!("'{s}' has a zero dimension: inputs must not be empty"));
        }
        Ok(InputSpec { name: name.to_string(), shape, dtype })
    }
}

/// A value for a symbolic dimension, `batch=8`, a range of values, `seq=1..512`, or the sum
/// of other dimensions' values, `total=past+seq` (the length of a decoder's mask and cache
/// output), which [`resolve_sums`] turns into a size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimSpec {
    /// The symbolic dimension's name.
    pub symbol: String,
    /// Its size: the largest of the range for a range.
    pub value: usize,
    /// The smallest size of a range (`value` for one size).
    pub low: usize,
    /// For a sum, the dimensions added (`value` and `low` are 0 until resolved); else empty.
    pub sum: Vec<String>,
}

impl DimSpec {
    /// Whether it names a range of sizes rather than one.
    pub fn is_range(&self) -> bool {
        self.low != self.value
    }
}

impl FromStr for DimSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (symbol, value) =
            s.split_once('=').ok_or_else(|| format!("'{s}' is not NAME=N or NAME=LO..HI"))?;
        if symbol.is_empty() {
            return Err(format!("'{s}' has no dimension name"));
        }
        if value.contains('+') {
            let parts: Vec<String> = value.split('+').map(|p| p.trim().to_string()).collect();
            let named = |p: &String| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_');
            if parts.iter().any(|p| !named(p) || p.chars().all(|c| c.is_ascii_digit())) {
                return Err(format!("'{s}': a sum adds dimension names (NAME=A+B)"));
            }
            return Ok(DimSpec { symbol: symbol.to_string(), value: 0, low: 0, sum: parts });
        }
        let size = |v: &str| -> Result<usize, String> {
            let n: usize = v.trim().parse().map_err(|_| format!("'{v}' in '{s}' is not a size"))?;
            if n == 0 {
                return Err(format!("'{s}': a dimension must be at least 1"));
            }
            Ok(n)
        };
        let (low, value) = match value.split_once("..") {
            Some((lo, hi)) => (size(lo)?, size(hi)?),
            None => (size(value)?, size(value)?),
        };
        if low > value {
            return Err(format!("'{s}': the range's low end {low} is over its high end {value}"));
        }
        Ok(DimSpec { symbol: symbol.to_string(), value, low, sum: Vec::new() })
    }
}

/// Gives each sum (`total=past+seq`) the size of its parts added, each part given one size by
/// another spec. A part that is not given, a part that is itself a sum, and a part given a
/// range are errors naming the spec: the ranges machinery follows products of dims, not sums
/// — a decoder's step is compiled for its cache's capacity instead, and one such bundle
/// serves every shorter cache through its mask.
pub fn resolve_sums(dims: Vec<DimSpec>) -> Result<Vec<DimSpec>, String> {
    let given = dims.clone();
    dims.into_iter()
        .map(|d| {
            if d.sum.is_empty() {
                return Ok(d);
            }
            let text = format!("{}={}", d.symbol, d.sum.join("+"));
            let mut total = 0;
            for part in &d.sum {
                let Some(p) = given.iter().find(|g| &g.symbol == part && g.sum.is_empty()) else {
                    return Err(format!("--dim {text}: give {part} one size (--dim {part}=N)"));
                };
                if p.is_range() {
                    return Err(format!(
                        "--dim {text}: {part} is a range ({}..{}), and a dim that is a sum follows one size of \
                         each part. For a decoder's cache, compile the step for the cache's capacity \
                         (--dim {part}={} --dim {text}): one such bundle serves every shorter cache, the mask \
                         marking the filled positions (what fusec generate does)",
                        p.low, p.value, p.value
                    ));
                }
                total += p.value;
            }
            Ok(DimSpec { symbol: d.symbol, value: total, low: total, sum: Vec::new() })
        })
        .collect()
}

/// Concrete shapes for the model's inputs.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Whole shapes by input (`--input`).
    pub inputs: Vec<InputSpec>,
    /// Sizes by symbolic dimension (`--dim`); the largest size for a range.
    pub dims: BTreeMap<String, usize>,
    /// The smallest size of each symbolic dimension given a range (`--dim seq=1..512`).
    pub low: BTreeMap<String, usize>,
    /// Graph inputs frozen to these values: they become constants (and can then be shapes,
    /// axes or repeats), no longer inputs.
    pub constants: Vec<(String, crate::ir::Tensor)>,
}

impl ImportOptions {
    /// Options from `--input` and `--dim` specs.
    pub fn new(inputs: Vec<InputSpec>, dims: Vec<DimSpec>) -> Self {
        ImportOptions {
            inputs,
            low: dims.iter().filter(|d| d.is_range()).map(|d| (d.symbol.clone(), d.low)).collect(),
            // A sum not resolved ([`resolve_sums`]) leaves its dim unset (an import error names it).
            dims: dims.into_iter().filter(|d| d.sum.is_empty()).map(|d| (d.symbol, d.value)).collect(),
            constants: Vec::new(),
        }
    }

    /// The dimensions given a range, `(symbol, low, high)`, in name order.
    pub fn ranges(&self) -> Vec<(String, usize, usize)> {
        self.low.iter().filter_map(|(s, &lo)| Some((s.clone(), lo, *self.dims.get(s)?))).collect()
    }

    /// Sets symbolic dimension `symbol` to `value`.
    pub fn dim(mut self, symbol: &str, value: usize) -> Self {
        self.dims.insert(symbol.to_string(), value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_specs_parse() {
        let spec: InputSpec = "input_ids:8x128:i64".parse().unwrap();
        assert_eq!(
            spec,
            InputSpec { name: "input_ids".into(), shape: vec![8, 128], dtype: Some(DType::I64) }
        );
        let spec: InputSpec = "x:3".parse().unwrap();
        assert_eq!((spec.shape, spec.dtype), (vec![3], None));
        assert!("x".parse::<InputSpec>().is_err());
        assert!("x:8xq".parse::<InputSpec>().is_err());
        assert!("x:8:f8".parse::<InputSpec>().unwrap_err().contains("unknown element type"));
        assert_eq!(
            "seq=7".parse::<DimSpec>().unwrap(),
            DimSpec { symbol: "seq".into(), value: 7, low: 7, sum: vec![] }
        );
        let range = "seq=1..512".parse::<DimSpec>().unwrap();
        assert_eq!((range.low, range.value, range.is_range()), (1, 512, true));
        assert!("seq=9..3".parse::<DimSpec>().unwrap_err().contains("over its high end"));
        assert!("seq=0..3".parse::<DimSpec>().unwrap_err().contains("at least 1"));
        assert!("seq=1..x".parse::<DimSpec>().unwrap_err().contains("not a size"));
        let options = ImportOptions::new(vec![], vec![range, "batch=4".parse().unwrap()]);
        assert_eq!(options.ranges(), vec![("seq".to_string(), 1, 512)]);
        assert_eq!(options.dims["seq"], 512);
        assert!("seq".parse::<DimSpec>().is_err());
        assert!("seq=0".parse::<DimSpec>().unwrap_err().contains("at least 1"));
        assert!("x:2x0".parse::<InputSpec>().unwrap_err().contains("zero dimension"));
    }

    #[test]
    fn sums_take_their_parts_sizes() {
        let specs = |list: &[&str]| -> Vec<DimSpec> { list.iter().map(|d| d.parse().unwrap()).collect() };
        let resolved = resolve_sums(specs(&["past=63", "seq=1", "total=past+seq"])).unwrap();
        assert_eq!((resolved[2].symbol.as_str(), resolved[2].value, resolved[2].low), ("total", 64, 64));
        let options = ImportOptions::new(vec![], resolved);
        assert_eq!((options.dims["total"], options.ranges().len()), (64, 0));
        let err = resolve_sums(specs(&["past=1..2047", "seq=1", "total=past+seq"])).unwrap_err();
        assert!(err.contains("past is a range (1..2047)") && err.contains("--dim past=2047"), "{err}");
        let err = resolve_sums(specs(&["seq=1", "total=past+seq"])).unwrap_err();
        assert!(err.contains("give past one size"), "{err}");
        assert!("total=past+".parse::<DimSpec>().unwrap_err().contains("adds dimension names"));
        assert!("total=3+seq".parse::<DimSpec>().unwrap_err().contains("adds dimension names"));
        // Unresolved, a sum sets nothing.
        assert!(!ImportOptions::new(vec![], specs(&["total=past+seq"])).dims.contains_key("total"));
    }
}
