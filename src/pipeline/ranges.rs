//! The planner for ranges of sizes (`--dim batch=1..32 --dim seq=1..512`).
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
use std::path::Path;

use thiserror::Error;

use std::sync::Arc;

use super::{fuse_model, lower_fused, CompileError, CompileOptions, FusedModel};
use crate::ir::{
    ranges_text, tops, with_sums, DType, DimRange, Graph, NodeId, SymDim, SymbolicShapes, Tensor,
};
use crate::passes::{self, SharedConstants};
use crate::plan::Plan;

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
    /// A cache updated in place asked for with ranges.
    #[error("a cache updated in place (--cache-in-place) holds one batch and one capacity, not ranges ({ranges}): compile the ranges without it (each step's present written whole), or give every dim one size")]
    CacheInPlace {
        /// The ranges, `batch=1..32, past=1..2047`.
        ranges: String,
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

/// The program of [`super::plan_reporting`] for the top of every range in
/// `options.import`, and the symbolic shape of each of its values. With no ranges, every
/// shape is static.
pub fn plan_symbolic(path: &Path, options: &CompileOptions) -> Result<(Plan, SymbolicShapes), CompileError> {
    let symbols: Vec<DimRange> = options.import.ranges();
    if options.cache_in_place && !symbols.is_empty() {
        return Err(SymbolicError::CacheInPlace { ranges: ranges_text(&symbols) }.into());
    }
    let high = tops(&symbols);
    let sums = |values: Vec<usize>| with_sums(&symbols, &values).unwrap_or(values);
    // The dims moved on their own: not the sums of others (`total=past+seq`), which move with
    // their parts.
    let moved: Vec<usize> = (0..symbols.len()).filter(|&i| !symbols[i].is_sum()).collect();
    // The sizes planned: the top; one dim moved down its range at a time, to half the top
    // (fits each dim's power; not to the bottom: at size 1 the passes take shortcuts — a
    // broadcast or a reshape of a size-1 axis dropped — and at small sizes the cost model
    // extracts another program, which the fit could not compare); every dim a third of the
    // way up its range (checks the fit at sizes it was not made at).
    let mut points = vec![high.clone()];
    for &i in &moved {
        let mut values = high.clone();
        values[i] = probe(&symbols[i]);
        points.push(sums(values));
    }
    let middle = sums(symbols.iter().map(|r| r.low + (r.high - r.low) / 3).collect());
    if !points.contains(&middle) {
        points.push(middle);
    }
    let at = |values: &[usize]| {
        let mut options = options.clone();
        options.import = options.import.at(values);
        options
    };
    // The cost model's attention choices are made a third of the way up the ranges (the
    // point planned first; the top where there is no other): at the top of a long sequence
    // range it would take GEMM + softmax + GEMM for every size. Every other size is planned
    // with its choices: one program.
    let deciding = if points.len() > moved.len() + 1 { points.len() - 1 } else { 0 };
    let clock = std::time::Instant::now();
    let options_at = |i: usize, attention: &Option<Vec<bool>>| {
        let mut options = at(&points[i]);
        if attention.is_some() {
            options.attention = attention.clone();
        }
        options
    };
    // Three stages, every size through each before the next, so that the model's weights are
    // held about once. (1) The file is read and its weights converted once
    // (`with_translator`), and every size imported, put through the passes and fused; the
    // constants the passes derive from the weights (the merged Q, K and V projections) are
    // made once for every size (`derived`). (2) In f16, every size's f32 constants are
    // converted together, each value once and let go as soon as it is
    // (`passes::halve_constants`): the weights are never held in both types. (3) Each size
    // lowered and planned, the top's first; every other size compared with the top's program
    // as soon as it is planned, and its constants then let go (the shapes are what the fit
    // needs).
    let derived = SharedConstants::default();
    let (mut fused, decided) = crate::import::with_translator(path, |translate| {
        let fuse_at = |i: usize, attention: &Option<Vec<bool>>| {
            let options = options_at(i, attention);
            let model = translate(&options.import)?;
            fuse_model(model, path, &options, &mut |_| {}, Some(&derived))
        };
        let first = fuse_at(deciding, &None)?;
        let decided = first.report().map(|r| r.attention.clone());
        let mut fused: Vec<Option<FusedModel>> = (0..points.len()).map(|_| None).collect();
        fused[deciding] = Some(first);
        let others: Vec<usize> = (0..points.len()).filter(|&i| i != deciding).collect();
        let done = crate::parallel::map_on(planners(), &others, |&i| fuse_at(i, &decided));
        for (&i, result) in others.iter().zip(done) {
            fused[i] = Some(result?);
        }
        Ok::<_, CompileError>((fused.into_iter().flatten().collect::<Vec<_>>(), decided))
    })??;
    // The concatenations' sources and results go: the graphs hold what they use.
    drop(derived);
    let halved: Vec<Option<Halved>> = match options.precision {
        DType::F16 => {
            let mut graphs: Vec<&mut Graph> = fused.iter_mut().map(|f| f.graph_mut()).collect();
            passes::halve_constants(&mut graphs, DType::F16, None).into_iter().map(Some).collect()
        }
        _ => (0..fused.len()).map(|_| None).collect(),
    };
    // bf16 converts each constant as its readers want it: once for every size.
    let casts = SharedConstants::default();
    let attention_of = |i: usize| if i == deciding { None } else { decided.clone() };
    let lower = |(i, fused, halved): Size| {
        lower_fused(fused, &options_at(i, &attention_of(i)), &mut |_| {}, Some(&casts), halved)
            .map(|(plan, _)| plan)
    };
    // Each size, in the order of `points`: the top first, lowered alone, then the others.
    let mut sizes: Vec<Size> =
        fused.into_iter().zip(halved).enumerate().map(|(i, (fused, halved))| (i, fused, halved)).collect();
    let others = sizes.split_off(1);
    let base = lower(sizes.remove(0))?;
    let compare = |i: usize, plan: Plan| compared(&base, plan, i <= moved.len(), &symbols, &points[i], &high);
    let checks: Vec<(usize, Compared)> = crate::parallel::map_owned_on(planners(), others, |job| {
        let i = job.0;
        Ok::<_, CompileError>((i, compare(i, lower(job)?)?))
    })
    .into_iter()
    .collect::<Result<_, _>>()?;
    let planned = clock.elapsed().as_secs_f64();
    let fitted: Vec<(usize, &[usize], &Plan)> =
        checks.iter().zip(&moved).map(|((i, c), &dim)| (dim, points[*i].as_slice(), &c.plan)).collect();
    let shapes = fit(&base, &symbols, &fitted)?;
    let symbolic = SymbolicShapes::new(symbols.clone(), decided.clone(), shapes);
    for (i, c) in &checks {
        let check = Check {
            base: &base,
            symbolic: &symbolic,
            values: &points[*i],
            plan: &c.plan,
            by_name: c.by_name.as_ref(),
        };
        check.shapes()?;
    }
    tracing::info!(
        "ranges {}: {} sizes imported, planned and compared in {planned:.2} s, fitted and checked in {:.2} s",
        symbolic.ranges(),
        points.len(),
        clock.elapsed().as_secs_f64() - planned
    );
    // The other sizes' plans go before the top's weights are written.
    drop(checks);
    let mut base = base;
    base.place_weights();
    Ok((base, symbolic))
}

/// A size to lower: its place in the points, its fused graph, its halved constants.
type Size = (usize, FusedModel, Option<Halved>);

/// A size's f32 constants converted to f16 ([`passes::halve_constants`]), by node.
type Halved = HashMap<NodeId, Arc<Tensor>>;

/// A size's plan compared with the top's: its constants checked and let go.
struct Compared {
    plan: Plan,
    /// Where it is another program: the node of `plan` for each of the top's it has.
    by_name: Option<HashMap<NodeId, NodeId>>,
}

/// `plan` (at `values`) compared with `base` (at `high`): the same program where the fit is
/// made at it (`fitting`), else the nodes of the same name; its constants the leading part of
/// the top's. Its constants are let go after.
fn compared(
    base: &Plan,
    mut plan: Plan,
    fitting: bool,
    symbols: &[DimRange],
    values: &[usize],
    high: &[usize],
) -> Result<Compared, CompileError> {
    let differs = |what| SymbolicError::Differs {
        at: assignment(symbols, values),
        top: assignment(symbols, high),
        what,
    };
    // The sizes the fit is made at must plan the same program. At the check point the cost
    // model may extract another form of a few nodes (a scale folded into a weight at smaller
    // sizes): the nodes both programs have are compared there, by name.
    let by_name = match same_program(base, &plan) {
        Ok(()) => None,
        Err(what) if fitting => return Err(differs(what).into()),
        Err(what) => {
            let names = counterparts(base, &plan);
            if names.len() * 10 < base.graph.node_count() * 9 {
                return Err(differs(what).into());
            }
            tracing::info!(
                "the program at {} differs from the top's ({what}); its {} nodes of the same name are checked",
                assignment(symbols, values),
                names.len()
            );
            Some(names)
        }
    };
    constants_hold(base, &plan, by_name.as_ref(), symbols, values)?;
    let constants: Vec<NodeId> =
        plan.graph.node_ids().filter(|&id| plan.graph.constant(id).is_some()).collect();
    for id in constants {
        plan.graph.take_constant(id);
    }
    Ok(Compared { plan, by_name })
}

/// How many sizes other than the top's are fused, and then lowered, side by side
/// (`FUSEC_RANGE_PLANNERS`, default as many as there are cores: the compile's time against
/// its peak memory, `benches/NOTES.md`).
fn planners() -> usize {
    std::env::var("FUSEC_RANGE_PLANNERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(usize::MAX)
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
/// from `moved`: the plans with one dim moved to its [`probe`] each (and the sums of it with
/// it): the dim, every dim's size there, the plan. A sum's power is tried first at 0, then up: the first
/// powers that give every moved plan's size.
fn fit(
    base: &Plan,
    symbols: &[DimRange],
    moved: &[(usize, &[usize], &Plan)],
) -> Result<HashMap<NodeId, Vec<SymDim>>, SymbolicError> {
    let high = tops(symbols);
    let sums: Vec<usize> = (0..symbols.len()).filter(|&i| symbols[i].is_sum()).collect();
    // Every assignment of powers 0..=2 to the sums, fewest first.
    let mut sum_powers: Vec<Vec<u32>> = vec![Vec::new()];
    for _ in &sums {
        sum_powers = sum_powers
            .into_iter()
            .flat_map(|p| (0..=2u32).map(move |q| [p.clone(), vec![q]].concat()))
            .collect();
    }
    sum_powers.sort_by_key(|p| p.iter().sum::<u32>());
    let mut shapes = HashMap::new();
    for id in base.graph.node_ids() {
        let node = base.graph.node(id);
        let mut dims = Vec::with_capacity(node.ty.rank());
        for (axis, &top) in node.ty.shape.iter().enumerate() {
            let found = sum_powers.iter().find_map(|fixed| {
                let mut powers = vec![0u32; symbols.len()];
                for (&i, &p) in sums.iter().zip(fixed) {
                    powers[i] = p;
                }
                // Each moved dim's power: seen / top = Π (value there / high)^power, for the
                // one whole power of the moved dim that fits with the sums' powers fixed.
                for &(i, values, plan) in moved {
                    let seen = plan.graph.node(id).ty.shape[axis] as u128;
                    let (mut lhs, mut rhs) = (seen, top as u128);
                    for &j in &sums {
                        let p = powers[j];
                        lhs = lhs.checked_mul((high[j] as u128).checked_pow(p)?)?;
                        rhs = rhs.checked_mul((values[j] as u128).checked_pow(p)?)?;
                    }
                    let (hi, lo) = (high[i] as u128, values[i] as u128);
                    powers[i] =
                        (0..=4u32).find(|&p| lhs.checked_mul(hi.pow(p)) == rhs.checked_mul(lo.pow(p)))?;
                }
                let divisor = powers
                    .iter()
                    .zip(&high)
                    .try_fold(1u128, |d, (&p, &h)| d.checked_mul((h as u128).checked_pow(p)?))?;
                ((top as u128) % divisor == 0).then(|| SymDim::new((top as u128 / divisor) as usize, powers))
            });
            let Some(dim) = found else {
                let mut seen: Vec<(usize, Vec<(usize, usize)>)> = vec![(top, Vec::new())];
                for (_, values, plan) in moved {
                    let changes =
                        (0..symbols.len()).filter(|&i| values[i] != high[i]).map(|i| (i, values[i]));
                    seen.push((plan.graph.node(id).ty.shape[axis], changes.collect()));
                }
                return Err(not_a_product(node.name.clone(), axis, symbols, &seen));
            };
            dims.push(dim);
        }
        shapes.insert(id, dims);
    }
    Ok(shapes)
}

fn not_a_product(
    node: String,
    axis: usize,
    symbols: &[DimRange],
    seen: &[(usize, Vec<(usize, usize)>)],
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
}

/// Constants of `plan` are the leading part of `base`'s: the same where the shape is static.
fn constants_hold(
    base: &Plan,
    plan: &Plan,
    by_name: Option<&HashMap<NodeId, NodeId>>,
    symbols: &[DimRange],
    values: &[usize],
) -> Result<(), SymbolicError> {
    {
        for id in base.graph.node_ids() {
            if !matches!(base.graph.node(id).op, crate::ir::Op::Constant(_)) {
                continue;
            }
            let twin = match by_name {
                Some(names) => match names.get(&id) {
                    Some(&t) => t,
                    None => continue,
                },
                None => id,
            };
            // One value, shared (every weight, converted once for every size): equal.
            if let (Some(a), Some(b)) = (base.graph.constant(id), plan.graph.constant(twin)) {
                if std::sync::Arc::ptr_eq(a, b) && base.graph.node(id).ty == plan.graph.node(twin).ty {
                    continue;
                }
            }
            let (Some(top), Some(here)) = (base.constant_value(id), plan.constant_value(twin)) else {
                continue;
            };
            let symbolic_shape = base.graph.node(id).ty.shape != plan.graph.node(twin).ty.shape;
            let leading = top.leading_part(here.shape());
            if leading.as_ref() != Some(&here) {
                let (symbol, value) = symbols
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
