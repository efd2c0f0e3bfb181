//! Symbolic sizes: how the sizes of a program depend on the dims given a range
//! (`--dim batch=1..32 --dim seq=1..512`).
//!
//! The program is planned at the top of every range, then again with one dim at a time moved
//! to half its top, and once with every dim a third of the way up its range. The
//! plans must be the same program — the same nodes, ops, edges and kernels — and every size
//! of every value must be a whole number times a product of powers of the dims
//! (`batch*seq*768`, `seq*seq*12`): [`SymDim`]. What is not, is an error that names the node,
//! its axis and the sizes seen. Constants the import folded from the input shapes (position
//! ids, causal masks) must hold at a smaller size the leading part of what they hold at the
//! top size — so that one stored at the top size serves every size — and a constant whose
//! shape does not change must not change at all.
//!
//! Fitting sizes from planned instances, rather than carrying expressions through import and
//! every pass, keeps the passes and the e-graph on concrete shapes: whatever a pass does, the
//! fit sees what the program it made does with sizes, and checks it at sizes it did not fit.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use thiserror::Error;

use crate::ir::{NodeId, Tensor};
use crate::pipeline::{plan_model, CompileError, CompileOptions};
use crate::plan::{Location, Plan};

/// A dimension given a range of sizes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DimRange {
    /// Its name (`seq`).
    pub symbol: String,
    /// The smallest size.
    pub low: usize,
    /// The largest size: what the program is planned (and memory sized) for.
    pub high: usize,
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

/// Why a program cannot serve a range of sizes.
#[derive(Debug, Error)]
pub enum SymbolicError {
    /// The plans at two sizes are not the same program.
    #[error("the program for {at} differs from the one for {top}: {what}; a range needs one program for every size (compile for one size with --dim NAME=N)")]
    Differs {
        /// The dims' values of the other plan (`batch=32,seq=1`).
        at: String,
        /// The top of every range (`batch=32,seq=512`).
        top: String,
        /// What differs.
        what: String,
    },
    /// A size that is not a whole number times a product of powers of the dims.
    #[error("axis {axis} of '{node}' is {seen}: not a whole number times powers of the dims given ranges ({ranges}), which a range of sizes needs (compile for one size with --dim NAME=N)")]
    NotAProduct {
        /// The value's name.
        node: String,
        /// Its axis.
        axis: usize,
        /// The sizes seen, with the dims' values (`512 at seq=512, 2 at seq=1`).
        seen: String,
        /// The ranges, `batch=1..32, seq=1..512`.
        ranges: String,
    },
    /// A range no input axis follows alone, so a session could not read its size.
    #[error("no input axis is {symbol} alone (times a whole number), so a run could not tell {symbol} from its inputs (the inputs: {inputs}); give {symbol} one size with --dim {symbol}=N")]
    Unreadable {
        /// The dim.
        symbol: String,
        /// The inputs and their symbolic shapes.
        inputs: String,
    },
    /// A folded constant whose values depend on a dim in a way one stored copy cannot serve.
    #[error("constant '{node}' is folded from the input shapes and its values at {symbol}={value} are not {at_high}: one stored constant cannot serve the range (compile for one size with --dim {symbol}=N)")]
    Constant {
        /// The constant's name.
        node: String,
        /// The dim moved.
        symbol: String,
        /// The size it was moved to.
        value: usize,
        /// What the values at the top size would have to give.
        at_high: &'static str,
    },
}

/// The symbolic shape of every value of a program planned at the top of its ranges.
#[derive(Clone, Debug)]
pub struct SymbolicShapes {
    /// The dims given ranges, in name order.
    pub symbols: Vec<DimRange>,
    /// The cost model's choices at the top of the ranges, which the program keeps at every
    /// size ([`CompileOptions::attention`]).
    pub attention: Option<Vec<bool>>,
    shapes: HashMap<NodeId, Vec<SymDim>>,
}

impl SymbolicShapes {
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

    /// The program of `plan` (planned at the top of the ranges) with the symbols at `values`:
    /// every shape evaluated, the shapes ops carry (reshape and expand targets, slice lengths,
    /// tile counts) set to match, and each constant cut to its leading part there — what a
    /// bundle for the ranges computes at that point, for the CPU reference evaluator
    /// ([`crate::ir::evaluate`]) to run. The error names the first node that cannot be.
    pub fn instantiate(&self, plan: &Plan, values: &[usize]) -> Result<crate::ir::Graph, String> {
        use crate::ir::Op;
        let mut graph = plan.graph.clone();
        let ids: Vec<NodeId> = graph.node_ids().collect();
        for id in ids {
            let name = graph.node(id).name.clone();
            let shape = self.eval(id, values).ok_or_else(|| format!("'{name}': its shape overflows"))?;
            if shape.len() != graph.node(id).ty.rank() {
                return Err(format!("'{name}' has no symbolic shape"));
            }
            let input_shape = graph.inputs_of(id).first().and_then(|&i| self.eval(i, values));
            let constant = match graph.node(id).op {
                Op::Constant(_) => Some(
                    constant_value(plan, id)
                        .and_then(|top| top.leading_part(&shape))
                        .ok_or_else(|| format!("constant '{name}' has no leading part of shape {shape:?}"))?,
                ),
                _ => None,
            };
            let node = graph.node_mut(id);
            match &mut node.op {
                Op::Reshape { shape: to } | Op::Expand { shape: to } => *to = shape.clone(),
                Op::Slice { axes } => {
                    for (a, d) in axes.iter_mut().zip(&shape) {
                        a.len = *d;
                    }
                }
                Op::Tile { repeats } => {
                    let input = input_shape.ok_or_else(|| format!("'{name}': a tile without an input"))?;
                    *repeats = shape.iter().zip(&input).map(|(o, i)| o / (*i).max(1)).collect();
                }
                Op::Constant(value) => {
                    if let Some(c) = constant {
                        *value = std::sync::Arc::new(c);
                    }
                }
                _ => {}
            }
            node.ty.shape = shape;
        }
        Ok(graph)
    }
}

fn ranges_text(symbols: &[DimRange]) -> String {
    symbols.iter().map(|r| format!("{}={}..{}", r.symbol, r.low, r.high)).collect::<Vec<_>>().join(", ")
}

/// The program of [`crate::pipeline::plan_reporting`] for the top of every range in
/// `options.import`, and the symbolic shape of each of its values. With no ranges, every
/// shape is static.
pub fn plan_symbolic(path: &Path, options: &CompileOptions) -> Result<(Plan, SymbolicShapes), CompileError> {
    let symbols: Vec<DimRange> = options
        .import
        .ranges()
        .into_iter()
        .map(|(symbol, low, high)| DimRange { symbol, low, high })
        .collect();
    let high = tops(&symbols);
    // The sizes planned: the top; one dim moved down its range at a time, to half the top
    // (fits each dim's power; not to the bottom: at size 1 the passes take shortcuts — a
    // broadcast or a reshape of a size-1 axis dropped — and at small sizes the cost model
    // extracts another program, which the fit could not compare); every dim a third of the
    // way up its range (checks the fit at sizes it was not made at).
    let mut points = vec![high.clone()];
    for (i, range) in symbols.iter().enumerate() {
        let mut values = high.clone();
        values[i] = probe(range);
        points.push(values);
    }
    let middle: Vec<usize> = symbols.iter().map(|r| r.low + (r.high - r.low) / 3).collect();
    if !points.contains(&middle) {
        points.push(middle);
    }
    let at = |values: &[usize]| {
        let mut options = options.clone();
        for (range, &v) in symbols.iter().zip(values) {
            options.import.dims.insert(range.symbol.clone(), v);
        }
        options
    };
    // The file read and its weights converted once for every size.
    let clock = std::time::Instant::now();
    let imports: Vec<_> = points.iter().map(|v| at(v).import).collect();
    let models = crate::import::import_each(path, &imports)?;
    let imported = clock.elapsed().as_secs_f64();
    // The cost model's attention choices are made a third of the way up the ranges (the
    // point planned last; the top where there is no other): at the top of a long sequence
    // range it would take GEMM + softmax + GEMM for every size. That point is planned first,
    // then every other side by side with its choices: one program.
    let deciding = if points.len() > symbols.len() + 1 { points.len() - 1 } else { 0 };
    let mut models: Vec<Option<crate::import::Model>> = models.into_iter().map(Some).collect();
    let model =
        models[deciding].take().ok_or(crate::import::ImportError::NoGraph { path: path.to_path_buf() })?;
    let (first, report) = plan_model(model, path, &at(&points[deciding]), &mut |_| {})?;
    let decided = report.map(|r| r.attention);
    type Planned = Result<Plan, CompileError>;
    let planned: Vec<(usize, Planned)> = std::thread::scope(|scope| {
        let handles: Vec<_> = points
            .iter()
            .zip(models)
            .enumerate()
            .filter_map(|(i, (values, model))| Some((i, values, model?)))
            .map(|(i, values, model)| {
                let mut options = at(values);
                options.attention = decided.clone();
                (i, scope.spawn(move || plan_model(model, path, &options, &mut |_| {}).map(|(plan, _)| plan)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(i, h)| (i, h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))))
            .collect()
    });
    let mut plans: Vec<Option<Planned>> = (0..points.len()).map(|_| None).collect();
    plans[deciding] = Some(Ok(first));
    for (i, plan) in planned {
        plans[i] = Some(plan);
    }
    let mut plans = plans.into_iter().map(|p| {
        p.unwrap_or_else(|| Err(crate::import::ImportError::NoGraph { path: path.to_path_buf() }.into()))
    });
    let base = plans.next().ok_or(crate::import::ImportError::NoGraph { path: path.to_path_buf() })??;
    let top_planned = clock.elapsed().as_secs_f64();
    let mut checks = Vec::with_capacity(points.len() - 1);
    for (values, plan) in points[1..].iter().zip(plans) {
        let plan = plan?;
        let differs = |what| SymbolicError::Differs {
            at: assignment(&symbols, values),
            top: assignment(&symbols, &high),
            what,
        };
        // The sizes the fit is made at must plan the same program. At the check point the
        // cost model may extract another form of a few nodes (a scale folded into a weight at
        // smaller sizes): the nodes both programs have are compared there, by name.
        let fitting = checks.len() < symbols.len();
        let by_name = match same_program(&base, &plan) {
            Ok(()) => None,
            Err(what) if fitting => return Err(differs(what).into()),
            Err(what) => {
                let names = counterparts(&base, &plan);
                if names.len() * 10 < base.graph.node_count() * 9 {
                    return Err(differs(what).into());
                }
                tracing::info!(
                    "the program at {} differs from the top's ({what}); its {} nodes of the same name are checked",
                    assignment(&symbols, values),
                    names.len()
                );
                Some(names)
            }
        };
        checks.push((values.clone(), plan, by_name));
    }
    let others_planned = clock.elapsed().as_secs_f64();
    let fitted: Vec<&Plan> = checks.iter().take(symbols.len()).map(|(_, p, _)| p).collect();
    let shapes = fit(&base, &symbols, &fitted)?;
    let symbolic = SymbolicShapes { symbols: symbols.clone(), attention: decided.clone(), shapes };
    for (values, plan, by_name) in &checks {
        let check = Check { base: &base, symbolic: &symbolic, values, plan, by_name: by_name.as_ref() };
        check.shapes()?;
        check.constants()?;
    }
    tracing::info!(
        "ranges {}: {} sizes imported in {imported:.2} s, planned in {:.2} s, compared in {:.2} s, checked in {:.2} s",
        symbolic.ranges(),
        points.len(),
        top_planned - imported,
        others_planned - top_planned,
        clock.elapsed().as_secs_f64() - others_planned
    );
    Ok((base, symbolic))
}

/// The size a dim is moved to for its fit: half the top of its range, or the bottom where
/// that is higher (2 where the bottom is 1 and the top 2 or 3, as at size 1 the passes take
/// shortcuts).
fn probe(range: &DimRange) -> usize {
    let half = (range.high / 2).max(range.low);
    if half == 1 && range.high > 1 {
        2.min(range.high - 1).max(range.low)
    } else {
        half
    }
}

/// `batch=32,seq=1`.
fn assignment(symbols: &[DimRange], values: &[usize]) -> String {
    symbols.iter().zip(values).map(|(r, v)| format!("{}={v}", r.symbol)).collect::<Vec<_>>().join(",")
}

/// Why `b` is not the same program as `a`, if it is not.
fn same_program(a: &Plan, b: &Plan) -> Result<(), String> {
    let (ga, gb) = (&a.graph, &b.graph);
    if ga.node_count() != gb.node_count() {
        let names = |g: &crate::ir::Graph| -> std::collections::HashSet<String> {
            g.node_ids().map(|id| g.node(id).name.clone()).collect()
        };
        let (na, nb) = (names(ga), names(gb));
        let describe = |g: &crate::ir::Graph, missing: &std::collections::HashSet<String>| {
            let mut found: Vec<String> = g
                .node_ids()
                .filter(|&id| missing.contains(&g.node(id).name))
                .map(|id| format!("'{}' ({})", g.node(id).name, g.node(id).op.kind()))
                .collect();
            found.truncate(3);
            found.join(", ")
        };
        let only_top: std::collections::HashSet<String> = na.difference(&nb).cloned().collect();
        let only_here: std::collections::HashSet<String> = nb.difference(&na).cloned().collect();
        return Err(format!(
            "{} nodes against {} (only at the top: {}; only there: {})",
            gb.node_count(),
            ga.node_count(),
            describe(ga, &only_top),
            describe(gb, &only_here)
        ));
    }
    for id in ga.node_ids() {
        if !gb.contains(id) {
            return Err(format!("'{}' is missing", ga.node(id).name));
        }
        let (na, nb) = (ga.node(id), gb.node(id));
        if na.name != nb.name || !same_op(&na.op, &nb.op) || ga.inputs_of(id) != gb.inputs_of(id) {
            return Err(format!(
                "'{}' ({}) is '{}' ({}) there",
                na.name,
                na.op.kind(),
                nb.name,
                nb.op.kind()
            ));
        }
        if na.ty.dtype != nb.ty.dtype || na.ty.rank() != nb.ty.rank() {
            return Err(format!("'{}' is {} there, {} here", na.name, nb.ty, na.ty));
        }
    }
    if a.kernels.len() != b.kernels.len() {
        return Err(format!("{} kernels against {}", b.kernels.len(), a.kernels.len()));
    }
    for (k, (ka, kb)) in a.kernels.iter().zip(&b.kernels).enumerate() {
        if ka.kind.name() != kb.kind.name() || ka.nodes != kb.nodes || ka.outputs != kb.outputs {
            return Err(format!("kernel {k} is {} there, {} here", kb.kind.name(), ka.kind.name()));
        }
    }
    Ok(())
}

/// Whether two ops are the same but for what follows from their shapes (a reshape's or an
/// expand's target, a slice's length, a tile's repeats), which the fit of the shapes covers; a
/// constant's values are compared on their own ([`Check::constants`]). A slice that starts
/// elsewhere at another size (the last token: `x[:, -1]`) is another program.
fn same_op(a: &crate::ir::Op, b: &crate::ir::Op) -> bool {
    use crate::ir::Op;
    match (a, b) {
        (Op::Reshape { .. }, Op::Reshape { .. })
        | (Op::Expand { .. }, Op::Expand { .. })
        | (Op::Tile { .. }, Op::Tile { .. })
        | (Op::Constant(_), Op::Constant(_)) => true,
        (Op::Slice { axes: x }, Op::Slice { axes: y }) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.start == q.start && p.step == q.step)
        }
        _ => a == b,
    }
}

/// For each node of `a`, the node of `b` of the same name, op and rank.
fn counterparts(a: &Plan, b: &Plan) -> HashMap<NodeId, NodeId> {
    let by_name: HashMap<&str, NodeId> =
        b.graph.node_ids().map(|id| (b.graph.node(id).name.as_str(), id)).collect();
    a.graph
        .node_ids()
        .filter_map(|id| {
            let node = a.graph.node(id);
            let other = *by_name.get(node.name.as_str())?;
            let twin = b.graph.node(other);
            (same_op(&node.op, &twin.op) && node.ty.rank() == twin.ty.rank()).then_some((id, other))
        })
        .collect()
}

/// Each size of `base` (every symbol at the top of its range) as a [`SymDim`], its powers
/// from `moved` (one symbol moved to its [`probe`] each).
fn fit(
    base: &Plan,
    symbols: &[DimRange],
    moved: &[&Plan],
) -> Result<HashMap<NodeId, Vec<SymDim>>, SymbolicError> {
    let mut shapes = HashMap::new();
    for id in base.graph.node_ids() {
        let node = base.graph.node(id);
        let mut dims = Vec::with_capacity(node.ty.rank());
        for (axis, &top) in node.ty.shape.iter().enumerate() {
            let mut powers = vec![0u32; symbols.len()];
            let mut divisor: u128 = 1;
            for (i, (range, plan)) in symbols.iter().zip(moved).enumerate() {
                let seen = plan.graph.node(id).ty.shape[axis];
                let (hi, lo) = (range.high as u128, probe(range) as u128);
                // seen / top = (low / high)^p, for the one whole p that fits.
                let power = (0..=4u32).find(|&p| (seen as u128) * hi.pow(p) == (top as u128) * lo.pow(p));
                let Some(power) = power else {
                    return Err(not_a_product(
                        node.name.clone(),
                        axis,
                        symbols,
                        &[(top, &[]), (seen, &[(i, probe(range))])],
                    ));
                };
                powers[i] = power;
                divisor *= hi.pow(power);
            }
            if (top as u128) % divisor != 0 {
                return Err(not_a_product(node.name.clone(), axis, symbols, &[(top, &[])]));
            }
            dims.push(SymDim::new((top as u128 / divisor) as usize, powers));
        }
        shapes.insert(id, dims);
    }
    Ok(shapes)
}

fn not_a_product(
    node: String,
    axis: usize,
    symbols: &[DimRange],
    seen: &[(usize, &[(usize, usize)])],
) -> SymbolicError {
    let at = |changes: &[(usize, usize)]| -> String {
        symbols
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let v = changes.iter().find(|(j, _)| *j == i).map_or(r.high, |&(_, v)| v);
                format!("{}={v}", r.symbol)
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let seen =
        seen.iter().map(|(v, changes)| format!("{v} at {}", at(changes))).collect::<Vec<_>>().join(", ");
    SymbolicError::NotAProduct { node, axis, seen, ranges: ranges_text(symbols) }
}

/// A constant's bytes where `plan` stores it in the weights.
fn stored_bytes(plan: &Plan, id: NodeId) -> Option<&[u8]> {
    let Location::Weights(offset) = *plan.locations.get(&id)? else { return None };
    plan.weights.get(offset..offset + plan.graph.node(id).ty.size_bytes())
}

/// A constant's values as stored in `plan` (in the weights, or still in the graph).
fn constant_value(plan: &Plan, id: NodeId) -> Option<Tensor> {
    if let Some(value) =
        plan.graph.constant(id).filter(|t| !t.is_empty() || plan.graph.node(id).ty.is_empty())
    {
        return Some((**value).clone());
    }
    let ty = &plan.graph.node(id).ty;
    let Location::Weights(offset) = *plan.locations.get(&id)? else { return None };
    let bytes = plan.weights.get(offset..offset + ty.size_bytes())?;
    crate::runtime::tensor_from_bytes(bytes, &ty.shape, ty.dtype).ok()
}

/// A plan at other sizes (the symbols at `values`) checked against the top's (`base`) and
/// the sizes fitted from it (`symbolic`).
#[derive(Clone, Copy)]
struct Check<'a> {
    base: &'a Plan,
    symbolic: &'a SymbolicShapes,
    values: &'a [usize],
    plan: &'a Plan,
    /// Where `plan` is another program: the node of `plan` for each of `base` it has.
    by_name: Option<&'a HashMap<NodeId, NodeId>>,
}

impl Check<'_> {
    /// The node of the other plan that `id` of the top's is.
    fn twin(self, id: NodeId) -> Option<NodeId> {
        match self.by_name {
            Some(names) => names.get(&id).copied(),
            None => Some(id),
        }
    }

    /// Every shape of `plan` is what `symbolic` gives at `values`.
    fn shapes(self) -> Result<(), SymbolicError> {
        let Check { base, symbolic, values, plan, .. } = self;
        for id in base.graph.node_ids() {
            let Some(twin) = self.twin(id) else { continue };
            let node = plan.graph.node(twin);
            for (axis, dim) in symbolic.shape(id).iter().enumerate() {
                let seen = node.ty.shape[axis];
                if dim.eval(values) != Some(seen) {
                    let fitted = dim.display(&symbolic.symbols);
                    return Err(SymbolicError::NotAProduct {
                        node: node.name.clone(),
                        axis,
                        seen: format!(
                            "{seen} at {}, where {fitted} fitted the other sizes",
                            assignment(&symbolic.symbols, values)
                        ),
                        ranges: symbolic.ranges(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Constants of `plan` are the leading part of `base`'s: the same where the shape is static.
    fn constants(self) -> Result<(), SymbolicError> {
        let Check { base, symbolic, values, plan, .. } = self;
        for id in base.graph.node_ids() {
            if !matches!(base.graph.node(id).op, crate::ir::Op::Constant(_)) {
                continue;
            }
            let Some(twin) = self.twin(id) else { continue };
            // Same shape and the same bytes (every weight): equal, without building tensors.
            if let (Some(a), Some(b)) = (stored_bytes(base, id), stored_bytes(plan, twin)) {
                if a == b && base.graph.node(id).ty == plan.graph.node(twin).ty {
                    continue;
                }
            }
            let (Some(top), Some(here)) = (constant_value(base, id), constant_value(plan, twin)) else {
                continue;
            };
            let symbolic_shape = symbolic.shape(id).iter().any(|d| !d.is_static());
            let leading = top.leading_part(here.shape());
            if leading.as_ref() != Some(&here) {
                let (symbol, value) = symbolic
                    .symbols
                    .iter()
                    .zip(values)
                    .find(|(r, v)| r.high != **v)
                    .map(|(r, v)| (r.symbol.clone(), *v))
                    .unwrap_or_default();
                return Err(SymbolicError::Constant {
                    node: base.graph.node(id).name.clone(),
                    symbol,
                    value,
                    at_high: if symbolic_shape {
                        "the leading part of its values at the top size"
                    } else {
                        "its values at the top size"
                    },
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for DimRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}..{}", self.symbol, self.low, self.high)
    }
}
