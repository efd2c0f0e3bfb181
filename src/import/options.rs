//! What the user says about input shapes: `--input NAME:8x128[:i64]` and `--dim batch=8`.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::ir::{DType, DimRange};

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
            v.trim().parse().map_err(|_| format!("'{v}' in '{s}' is not a size"))
        };
        let (low, value) = match value.split_once("..") {
            Some((lo, hi)) => (size(lo)?, size(hi)?),
            None => (size(value)?, size(value)?),
        };
        // Empty only as a cache's length (a prompt with nothing cached: `past=0`, `past=0..2047`;
        // Optimum's `past_sequence_length`).
        if low == 0 && !symbol.starts_with("past") {
            return Err(format!("'{s}': a dimension must be at least 1 (0 only for a cache's length, past)"));
        }
        if low > value {
            return Err(format!("'{s}': the range's low end {low} is over its high end {value}"));
        }
        Ok(DimSpec { symbol: symbol.to_string(), value, low, sum: Vec::new() })
    }
}

/// Gives each sum (`total=past+seq`) the size of its parts added, each part given one size by
/// another spec; a sum of parts of which some are given ranges is a range of its own whose
/// size at every point is its parts' added (a decoder's cache length over a range of cached
/// positions: one bundle for every step), its low and high their lows and highs added. A part
/// that is not given and a part that is itself a sum are errors naming the spec.
pub fn resolve_sums(dims: Vec<DimSpec>) -> Result<Vec<DimSpec>, String> {
    let given = dims.clone();
    dims.into_iter()
        .map(|d| {
            if d.sum.is_empty() {
                return Ok(d);
            }
            let text = format!("{}={}", d.symbol, d.sum.join("+"));
            let (mut low, mut high, mut ranged) = (0, 0, false);
            for part in &d.sum {
                let Some(p) = given.iter().find(|g| &g.symbol == part && g.sum.is_empty()) else {
                    return Err(format!("--dim {text}: give {part} a size or a range (--dim {part}=N)"));
                };
                if part == &d.symbol {
                    return Err(format!("--dim {text}: a dim cannot be a sum of itself"));
                }
                ranged |= p.is_range();
                low += p.low;
                high += p.value;
            }
            let sum = if ranged { d.sum } else { Vec::new() };
            Ok(DimSpec { symbol: d.symbol, value: high, low, sum })
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
    /// The dims given a range that are sums of others (`total=past+seq`), with their parts:
    /// their size (in `dims`, `low`) is always their parts' added.
    pub sums: BTreeMap<String, Vec<String>>,
}

impl ImportOptions {
    /// Options from `--input` and `--dim` specs.
    pub fn new(inputs: Vec<InputSpec>, dims: Vec<DimSpec>) -> Self {
        // A sum not resolved ([`resolve_sums`]: its size 0) leaves its dim unset (an import
        // error names it).
        let resolved = |d: &DimSpec| d.sum.is_empty() || d.value > 0;
        ImportOptions {
            inputs,
            low: dims
                .iter()
                .filter(|d| d.is_range() && resolved(d))
                .map(|d| (d.symbol.clone(), d.low))
                .collect(),
            sums: dims
                .iter()
                .filter(|d| !d.sum.is_empty() && d.is_range() && resolved(d))
                .map(|d| (d.symbol.clone(), d.sum.clone()))
                .collect(),
            dims: dims.into_iter().filter(|d| resolved(d)).map(|d| (d.symbol, d.value)).collect(),
            constants: Vec::new(),
        }
    }

    /// The dimensions given a range, in name order; a sum of others names its parts.
    pub fn ranges(&self) -> Vec<DimRange> {
        self.low
            .iter()
            .filter_map(|(s, &lo)| {
                let mut range = DimRange::new(s.clone(), lo, *self.dims.get(s)?);
                for part in self.sums.get(s).into_iter().flatten() {
                    if self.low.contains_key(part) {
                        range.sum.push(part.clone());
                    } else {
                        range.offset += self.dims.get(part).copied().unwrap_or(0);
                    }
                }
                Some(range)
            })
            .collect()
    }

    /// The options with the dims given ranges at `values` (one size for each of
    /// [`ImportOptions::ranges`], by position; each sum's size is its parts' added, whatever
    /// `values` holds for it).
    pub fn at(&self, values: &[usize]) -> Self {
        let ranges = self.ranges();
        let values = crate::ir::with_sums(&ranges, values).unwrap_or_else(|| values.to_vec());
        let mut options = self.clone();
        for (range, &v) in ranges.iter().zip(&values) {
            options.dims.insert(range.symbol.clone(), v);
        }
        options
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
        assert_eq!(options.ranges(), vec![DimRange::new("seq", 1, 512)]);
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
        // A part given a range: a range of its own, read from no input.
        let resolved = resolve_sums(specs(&["past=1..2047", "seq=1", "total=past+seq"])).unwrap();
        let options = ImportOptions::new(vec![], resolved);
        let ranges = options.ranges();
        assert_eq!(ranges.len(), 2, "{ranges:?}");
        assert_eq!((ranges[1].symbol.as_str(), ranges[1].low, ranges[1].high), ("total", 2, 2048));
        assert_eq!((ranges[1].sum.clone(), ranges[1].offset), (vec!["past".to_string()], 1));
        assert_eq!(ranges[1].to_string(), "total=past+1 (2..2048)");
        let at = options.at(&[17, 0]);
        assert_eq!((at.dims["past"], at.dims["seq"], at.dims["total"]), (17, 1, 18));
        let err = resolve_sums(specs(&["seq=1", "total=past+seq"])).unwrap_err();
        assert!(err.contains("give past a size"), "{err}");
        let err = resolve_sums(specs(&["seq=1", "total=total+seq"])).unwrap_err();
        assert!(err.contains("give total a size"), "{err}");
        assert!("total=past+".parse::<DimSpec>().unwrap_err().contains("adds dimension names"));
        assert!("total=3+seq".parse::<DimSpec>().unwrap_err().contains("adds dimension names"));
        // Unresolved, a sum sets nothing.
        assert!(!ImportOptions::new(vec![], specs(&["total=past+seq"])).dims.contains_key("total"));
    }
}
