//! Symbolic sizes: how the sizes of a program depend on the dims given a range
//! (`--dim batch=1..32 --dim seq=1..512`).
//!
//! The program is planned at the top of every range, then again with one dim at a time moved
//! down its range, and once with every dim in the middle of its range. The
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimRange {
    /// Its name (`seq`).
    pub symbol: String,
    /// The smallest size.
    pub low: usize,
    /// The largest size: what the program is planned (and memory sized) for.
    pub high: usize,
}

/// A size as `factor × Π symbolᵢ^powers[i]` (powers by position in
/// [`SymbolicShapes::symbols`]); a static size has every power 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymDim {
    /// The whole-number factor.
    pub factor: usize,
    /// The power of each symbol.
    pub powers: Vec<u32>,
}

impl SymDim {
    /// Whether it is one size whatever the symbols are.
    pub fn is_static(&self) -> bool {
        self.powers.iter().all(|&p| p == 0)
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
    /// A range the kernels cannot follow yet: they take run-time sizes only along the
    /// leading axis of every value (a batch).
    #[error("'{node}' ({op}) is {shape}: {why}. Bundles follow a range only along the leading axis of every value (a batch: --dim batch=1..32); other ranges need run-time strides, not built yet (compile for one size with --dim NAME=N)")]
    NotLeading {
        /// The value's name.
        node: String,
        /// Its op.
        op: String,
        /// Its symbolic shape.
        shape: String,
        /// What breaks the rule.
        why: String,
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
    let high: Vec<usize> = symbols.iter().map(|r| r.high).collect();
    // The sizes planned: the top; one dim moved down its range at a time (fits each dim's
    // power: not to 1 where the range has room, as at size 1 the passes take shortcuts — a
    // broadcast or a reshape of a size-1 axis dropped — that make another program, which the
    // fit could not compare); every dim in the middle of its range (checks the fit where it
    // was not made).
    let mut points = vec![high.clone()];
    for (i, range) in symbols.iter().enumerate() {
        let mut values = high.clone();
        values[i] = probe(range);
        points.push(values);
    }
    let middle: Vec<usize> = symbols.iter().map(|r| r.low + (r.high - r.low) / 2).collect();
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
    // Every size planned side by side, each deciding for itself; a size whose cost-model
    // choices differ from the top's is planned again with the top's: one program.
    type Planned = Result<(Plan, Option<crate::fusion::FusionReport>), CompileError>;
    let planned: Vec<Planned> = std::thread::scope(|scope| {
        let handles: Vec<_> = points
            .iter()
            .zip(models.iter().cloned())
            .map(|(values, model)| {
                let options = at(values);
                scope.spawn(move || plan_model(model, path, &options, &mut |_| {}))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    let mut planned = planned.into_iter();
    let Some(top) = planned.next() else {
        return Err(crate::import::ImportError::NoGraph { path: path.to_path_buf() }.into());
    };
    let (base, report) = top?;
    let top_planned = clock.elapsed().as_secs_f64();
    let decided = report.map(|r| r.attention);
    let mut checks = Vec::with_capacity(points.len() - 1);
    for ((values, model), plan) in points[1..].iter().zip(models.into_iter().skip(1)).zip(planned) {
        let (mut plan, report) = plan?;
        if report.map(|r| r.attention) != decided {
            let mut options = at(values);
            options.attention = decided.clone();
            plan = plan_model(model, path, &options, &mut |_| {})?.0;
        }
        same_program(&base, &plan).map_err(|what| SymbolicError::Differs {
            at: assignment(&symbols, values),
            top: assignment(&symbols, &high),
            what,
        })?;
        checks.push((values.clone(), plan));
    }
    let others_planned = clock.elapsed().as_secs_f64();
    let fitted = &checks[..symbols.len().min(checks.len())];
    let shapes = fit(&base, &symbols, fitted)?;
    let symbolic = SymbolicShapes { symbols: symbols.clone(), attention: decided.clone(), shapes };
    for (values, plan) in &checks {
        let check = Check { base: &base, symbolic: &symbolic, values, plan };
        check.shapes()?;
        check.constants()?;
    }
    tracing::info!(
        "ranges {}: {} sizes imported in {imported:.2} s, planned side by side in {:.2} s, planned again with the top's choices in {:.2} s, checked in {:.2} s",
        symbolic.ranges(),
        points.len(),
        top_planned - imported,
        others_planned - top_planned,
        clock.elapsed().as_secs_f64() - others_planned
    );
    Ok((base, symbolic))
}

/// The size a dim is moved to for its fit: the bottom of its range, or 2 where that is 1 and
/// the range goes past 2.
fn probe(range: &DimRange) -> usize {
    if range.low == 1 && range.high > 2 {
        2
    } else {
        range.low
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
        return Err(format!("{} nodes against {}", gb.node_count(), ga.node_count()));
    }
    for id in ga.node_ids() {
        if !gb.contains(id) {
            return Err(format!("'{}' is missing", ga.node(id).name));
        }
        let (na, nb) = (ga.node(id), gb.node(id));
        if na.name != nb.name || na.op.kind() != nb.op.kind() || ga.inputs_of(id) != gb.inputs_of(id) {
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

/// Each size of `base` (every symbol at the top of its range) as a [`SymDim`], its powers
/// from `moved` (one symbol moved to its [`probe`] each).
fn fit(
    base: &Plan,
    symbols: &[DimRange],
    moved: &[(Vec<usize>, Plan)],
) -> Result<HashMap<NodeId, Vec<SymDim>>, SymbolicError> {
    let mut shapes = HashMap::new();
    for id in base.graph.node_ids() {
        let node = base.graph.node(id);
        let mut dims = Vec::with_capacity(node.ty.rank());
        for (axis, &top) in node.ty.shape.iter().enumerate() {
            let mut powers = vec![0u32; symbols.len()];
            let mut divisor: u128 = 1;
            for (i, (range, (_, plan))) in symbols.iter().zip(moved).enumerate() {
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
            dims.push(SymDim { factor: (top as u128 / divisor) as usize, powers });
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
}

impl Check<'_> {
    /// Every shape of `plan` is what `symbolic` gives at `values`.
    fn shapes(self) -> Result<(), SymbolicError> {
        let Check { base, symbolic, values, plan } = self;
        for id in base.graph.node_ids() {
            let node = plan.graph.node(id);
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
        let Check { base, symbolic, values, plan } = self;
        for id in base.graph.node_ids() {
            if !matches!(base.graph.node(id).op, crate::ir::Op::Constant(_)) {
                continue;
            }
            // Same shape and the same bytes (every weight): equal, without building tensors.
            if let (Some(a), Some(b)) = (stored_bytes(base, id), stored_bytes(plan, id)) {
                if a == b && base.graph.node(id).ty == plan.graph.node(id).ty {
                    continue;
                }
            }
            let (Some(top), Some(here)) = (constant_value(base, id), constant_value(plan, id)) else {
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

impl SymbolicShapes {
    /// For a program with one range: the axis of each value that follows it, which must be
    /// the value's first axis larger than 1, the size there a whole multiple of the dim, and
    /// every other size static; ops must not reduce, slice, concatenate or contract along it.
    /// Then every kernel generated for the top of the range runs at any smaller size with
    /// only its launch and its bound scaled: index arithmetic never divides by that axis's
    /// size (nothing precedes it). `Err` names the first value that breaks the rule.
    ///
    /// One exception: a gather along that axis whose indices are a constant that, at each
    /// position along it, reads no later position (the exporters' index grids: row `b` of a
    /// batch gathers from row `b`) reads only rows that exist at any size.
    pub fn leading_axes(&self, plan: &Plan) -> Result<HashMap<NodeId, usize>, SymbolicError> {
        use crate::ir::Op;
        let graph = &plan.graph;
        let mut axes = HashMap::new();
        for id in graph.node_ids() {
            let node = graph.node(id);
            let fail = |why: String| SymbolicError::NotLeading {
                node: node.name.clone(),
                op: node.op.kind(),
                shape: self.display(id),
                why,
            };
            let symbolic: Vec<usize> =
                self.shape(id).iter().enumerate().filter(|(_, d)| !d.is_static()).map(|(a, _)| a).collect();
            let Some(&axis) = symbolic.first() else { continue };
            if self.symbols.len() != 1 {
                return Err(fail(format!("its sizes follow {} ranges", self.symbols.len())));
            }
            if symbolic.len() > 1 {
                return Err(fail("more than one axis follows the range".into()));
            }
            if self.shape(id)[axis].powers != [1] {
                return Err(fail(format!("axis {axis} follows a power of the range")));
            }
            if node.ty.shape[..axis].iter().any(|&d| d != 1) {
                return Err(fail(format!("axis {axis} follows the range but is not the leading axis")));
            }
            axes.insert(id, axis);
        }
        // Ops along an axis: not along the one that follows the range.
        for id in graph.node_ids() {
            let node = graph.node(id);
            let inputs = graph.inputs_of(id);
            let axis_of = |i: usize| inputs.get(i).and_then(|x| axes.get(x)).copied();
            let fail = |why: &str| SymbolicError::NotLeading {
                node: node.name.clone(),
                op: node.op.kind(),
                shape: self.display(id),
                why: why.to_string(),
            };
            let rank = |i: usize| inputs.get(i).map_or(0, |&x| graph.node(x).ty.rank());
            let a = axis_of(0);
            let high = self.symbols.first().map_or(1, |r| r.high);
            let bad = match &node.op {
                Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::CumSum { axis, .. } => a == Some(*axis),
                Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => a.is_some_and(|a| a >= *axis),
                Op::Reduce { axes: reduced, .. } => a.is_some_and(|a| reduced.contains(&a)),
                Op::Concat { axis } => (0..inputs.len()).any(|i| axis_of(i) == Some(*axis)),
                Op::Slice { axes: cut } => a.is_some_and(|a| {
                    cut.get(a).is_some_and(|c| c.start != 0 || c.step != 1 || c.len != node.ty.shape[a])
                }),
                Op::Gather { axis } => {
                    a == Some(*axis)
                        && !gathers_no_later_row(
                            plan,
                            inputs.first().copied(),
                            inputs.get(1).copied(),
                            &axes,
                            high,
                        )
                }
                Op::GatherElements { axis } => a == Some(*axis),
                Op::GatherNd { .. } => a.is_some(),
                Op::Trilu { .. } => a.is_some_and(|a| a + 2 >= rank(0)),
                Op::RotateHalf => a.is_some_and(|a| a + 1 == rank(0)),
                Op::Conv { .. } => a.is_some_and(|a| a != 0) || axis_of(1).is_some(),
                // The contraction and B's rows and columns stay static; A's last axis is K.
                Op::MatMul | Op::Gemm { .. } => {
                    a.is_some_and(|a| a + 1 >= rank(0)) || axis_of(1).is_some_and(|b| b + 2 >= rank(1))
                }
                Op::Attention { .. } => {
                    (0..inputs.len()).any(|i| axis_of(i).is_some_and(|x| x + 2 >= rank(i)))
                }
                _ => false,
            };
            if bad {
                return Err(fail("it works along the axis that follows the range"));
            }
        }
        Ok(axes)
    }
}

/// Whether `indices` is a constant that, gathering along the axis of `data` that follows the
/// range, reads for each size `b` of the range (its positions `b·per`…) only rows that exist
/// at that size (below `(b+1)·rows`, `rows` the data's rows per unit of the range).
fn gathers_no_later_row(
    plan: &Plan,
    data: Option<NodeId>,
    indices: Option<NodeId>,
    axes: &HashMap<NodeId, usize>,
    high: usize,
) -> bool {
    let (Some(data), Some(indices)) = (data, indices) else { return false };
    let (Some(&axis), Some(&data_axis), Some(value)) =
        (axes.get(&indices), axes.get(&data), constant_value(plan, indices))
    else {
        return false;
    };
    let per = plan.graph.node(indices).ty.shape[axis] / high.max(1);
    let rows = plan.graph.node(data).ty.shape[data_axis] / high.max(1);
    let values = value.to_i64();
    values.axis_iter(ndarray::Axis(axis)).enumerate().all(|(p, slice)| {
        let limit = (p / per.max(1) + 1) * rows;
        slice.iter().all(|&v| v >= 0 && (v as usize) < limit)
    })
}
