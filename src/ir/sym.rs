//! Sizes that follow ranges of dims (`--dim batch=1..32 --dim seq=1..512`): a size as a
//! whole number times powers of the dims ([`SymDim`]), the ranges ([`DimRange`]) and the
//! symbolic shape of every value of a program ([`SymbolicShapes`]). Every stage reads them
//! (plans, kernels, bundles, sessions); the planner that fits them is the pipeline's
//! (`pipeline::ranges`).

use std::collections::HashMap;
use std::fmt;

use super::graph::NodeId;

/// A dimension given a range of sizes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DimRange {
    /// Its name (`seq`).
    pub symbol: String,
    /// The smallest size.
    pub low: usize,
    /// The largest size: what the program is planned (and memory sized) for.
    pub high: usize,
    /// For a dim that is the sum of others, some given ranges (a decoder's `total=past+seq`),
    /// those given ranges: its size at every point is theirs added and [`DimRange::offset`],
    /// read from no input. Else empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sum: Vec<String>,
    /// For a sum, the sizes of its parts of one size, added.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl DimRange {
    /// A range of sizes of its own.
    pub fn new(symbol: impl Into<String>, low: usize, high: usize) -> Self {
        DimRange { symbol: symbol.into(), low, high, sum: Vec::new(), offset: 0 }
    }

    /// Whether its size is the sum of others' (read from no input).
    pub fn is_sum(&self) -> bool {
        !self.sum.is_empty()
    }
}

/// `values` (one size for each dim of `ranges`, by position) with each sum's size set to its
/// parts' added; `None` where a sum names a dim the ranges lack.
pub fn with_sums(ranges: &[DimRange], values: &[usize]) -> Option<Vec<usize>> {
    let mut out = values.to_vec();
    for (i, range) in ranges.iter().enumerate().filter(|(_, r)| r.is_sum()) {
        let mut total = range.offset;
        for part in &range.sum {
            let j = ranges.iter().position(|r| &r.symbol == part && !r.is_sum())?;
            total = total.checked_add(*values.get(j)?)?;
        }
        *out.get_mut(i)? = total;
    }
    Some(out)
}

/// A size as `factor × Π symbolᵢ^powers[i]` (powers by position in
/// [`SymbolicShapes::symbols`]); a static size has every power 0. Powers are kept without
/// trailing zeros ([`SymDim::new`]), so that equal sizes compare equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SymDim {
    /// The whole-number factor.
    pub factor: usize,
    /// The power of each symbol.
    pub powers: Vec<u32>,
}

/// The top of each range, in order: the point a program for ranges is planned (and its
/// memory sized) at.
pub fn tops(ranges: &[DimRange]) -> Vec<usize> {
    ranges.iter().map(|r| r.high).collect()
}

/// The C name of symbol `i`'s value in a kernel of a program for ranges of sizes: a
/// `long long` parameter.
pub fn symbol_param(i: usize) -> String {
    format!("fusec_d{i}")
}

impl SymDim {
    /// `factor × Π symbolᵢ^powers[i]`.
    pub fn new(factor: usize, mut powers: Vec<u32>) -> Self {
        while powers.last() == Some(&0) {
            powers.pop();
        }
        SymDim { factor, powers }
    }

    /// A static size.
    pub fn lit(n: usize) -> Self {
        SymDim { factor: n, powers: Vec::new() }
    }

    /// Static sizes.
    pub fn lits(shape: &[usize]) -> Vec<Self> {
        shape.iter().map(|&n| Self::lit(n)).collect()
    }

    /// Whether it is one size whatever the symbols are.
    pub fn is_static(&self) -> bool {
        self.powers.iter().all(|&p| p == 0)
    }

    /// Its size when static.
    pub fn value(&self) -> Option<usize> {
        self.is_static().then_some(self.factor)
    }

    /// Whether it is 1 whatever the symbols are.
    pub fn is_one(&self) -> bool {
        self.value() == Some(1)
    }

    /// Whether it is a multiple of `n` whatever the symbols are (a static multiple).
    pub fn divisible_by(&self, n: usize) -> bool {
        self.factor % n.max(1) == 0
    }

    /// The symbol it is alone, to the power 1, times a whole number (`seq`, `16*batch`): an
    /// axis the symbol's size can be read from.
    pub fn alone(&self) -> Option<usize> {
        let mut symbols = self.powers.iter().enumerate().filter(|(_, &p)| p > 0);
        match (symbols.next(), symbols.next()) {
            (Some((i, 1)), None) => Some(i),
            _ => None,
        }
    }

    /// The product of two sizes.
    pub fn mul(&self, other: &SymDim) -> SymDim {
        let len = self.powers.len().max(other.powers.len());
        let power = |p: &[u32], i: usize| p.get(i).copied().unwrap_or(0);
        let powers = (0..len).map(|i| power(&self.powers, i) + power(&other.powers, i)).collect();
        SymDim::new(self.factor * other.factor, powers)
    }

    /// The product of `dims` (1 for none).
    pub fn product<'a>(dims: impl IntoIterator<Item = &'a SymDim>) -> SymDim {
        dims.into_iter().fold(SymDim::lit(1), |acc, d| acc.mul(d))
    }

    /// It divided by `other`, where that is whole whatever the symbols are.
    pub fn div(&self, other: &SymDim) -> Option<SymDim> {
        if other.factor == 0 || self.factor % other.factor != 0 {
            return None;
        }
        let power = |p: &[u32], i: usize| p.get(i).copied().unwrap_or(0);
        let len = self.powers.len().max(other.powers.len());
        let powers = (0..len)
            .map(|i| power(&self.powers, i).checked_sub(power(&other.powers, i)))
            .collect::<Option<Vec<u32>>>()?;
        Some(SymDim::new(self.factor / other.factor, powers))
    }

    /// It divided by `n`, where its factor is a multiple of `n`.
    pub fn div_exact(&self, n: usize) -> Option<SymDim> {
        (n > 0 && self.factor % n == 0)
            .then(|| SymDim { factor: self.factor / n, powers: self.powers.clone() })
    }

    /// A C expression of type `long long` for it: `768LL`, `fusec_d1`, `(12LL * fusec_d0 * fusec_d1)`.
    pub fn c(&self) -> String {
        let mut terms: Vec<String> = Vec::new();
        if self.factor != 1 || self.is_static() {
            terms.push(format!("{}LL", self.factor));
        }
        for (i, &p) in self.powers.iter().enumerate() {
            for _ in 0..p {
                terms.push(symbol_param(i));
            }
        }
        match terms.len() {
            1 => terms.remove(0),
            _ => format!("({})", terms.join(" * ")),
        }
    }

    /// Its value with the symbols at `values` (by position); `None` on overflow.
    pub fn eval(&self, values: &[usize]) -> Option<usize> {
        self.powers
            .iter()
            .zip(values)
            .try_fold(self.factor, |acc, (&p, &v)| acc.checked_mul(v.checked_pow(p)?))
    }

    /// `batch*seq*768`, `seq`, `64` with the symbols' names.
    pub fn display(&self, symbols: &[DimRange]) -> String {
        let mut terms: Vec<String> = Vec::new();
        for (p, range) in self.powers.iter().zip(symbols) {
            for _ in 0..*p {
                terms.push(range.symbol.clone());
            }
        }
        if self.factor != 1 || terms.is_empty() {
            terms.push(self.factor.to_string());
        }
        terms.join("*")
    }
}

/// The symbolic shape of every value of a program planned at the top of its ranges.
#[derive(Clone, Debug)]
pub struct SymbolicShapes {
    /// The dims given ranges, in name order.
    pub symbols: Vec<DimRange>,
    /// The cost model's choices at the top of the ranges, which the program keeps at every
    /// size (the pipeline's `CompileOptions::attention`).
    pub attention: Option<Vec<bool>>,
    shapes: HashMap<NodeId, Vec<SymDim>>,
}

impl SymbolicShapes {
    /// The shapes fitted for `symbols`, by node.
    pub fn new(
        symbols: Vec<DimRange>,
        attention: Option<Vec<bool>>,
        shapes: HashMap<NodeId, Vec<SymDim>>,
    ) -> Self {
        SymbolicShapes { symbols, attention, shapes }
    }

    /// The symbolic shape of `id` (empty for a node the plan does not have).
    pub fn shape(&self, id: NodeId) -> &[SymDim] {
        self.shapes.get(&id).map(Vec::as_slice).unwrap_or_default()
    }

    /// `[batch, seq, 768]`.
    pub fn display(&self, id: NodeId) -> String {
        let dims: Vec<String> = self.shape(id).iter().map(|d| d.display(&self.symbols)).collect();
        format!("[{}]", dims.join(", "))
    }

    /// The concrete shape of `id` with the symbols at `values` (by position).
    pub fn eval(&self, id: NodeId, values: &[usize]) -> Option<Vec<usize>> {
        self.shape(id).iter().map(|d| d.eval(values)).collect()
    }

    /// Nodes with at least one size that depends on a symbol.
    pub fn symbolic_nodes(&self) -> usize {
        self.shapes.values().filter(|s| s.iter().any(|d| !d.is_static())).count()
    }

    /// `batch=1..32, seq=1..512`.
    pub fn ranges(&self) -> String {
        ranges_text(&self.symbols)
    }
}

/// `batch=1..32, seq=1..512`.
pub fn ranges_text(symbols: &[DimRange]) -> String {
    symbols.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for DimRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_sum() {
            let offset = if self.offset > 0 { format!("+{}", self.offset) } else { String::new() };
            write!(f, "{}={}{offset} ({}..{})", self.symbol, self.sum.join("+"), self.low, self.high)
        } else {
            write!(f, "{}={}..{}", self.symbol, self.low, self.high)
        }
    }
}
