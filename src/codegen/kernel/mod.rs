//! Elementwise, row-reduction and attention kernels.
//!
//! Every node a kernel computes becomes a local `v<N>`; values from other kernels, inputs
//! and weights are read from memory at coordinates traced back through views. Elementwise
//! kernels run one thread per output element; row kernels one block per row, recomputing
//! their pointwise prologue in each pass; attention one warp per 16 query rows (tensor cores)
//! or up to 8 threads per query row (f32).

use std::collections::{HashMap, HashSet};

use handlebars::Handlebars;

use super::expr::{binary, c_type, cast, header, literal, narrow, register_type, unary};
use super::index::{broadcast, delinearize, linearize, trace_back, trace_forward, Coords, Dims};
use super::index_checks::index_fault_code;

use crate::fusion::Kernel;
use crate::ir::SymDim;
use crate::ir::{DType, NodeId, Op, ReduceOp};
use crate::plan::{Location, Pattern, Plan};

pub const BLOCK: u32 = 256;

/// A library call's epilogue view of its result. A GEMM's raw product `alpha·A·B` is in
/// `location`; the GEMM node's value is that product, plus `beta·C` for an ONNX Gemm with C.
/// A convolution's result without its bias is there; the node's value adds the bias.
#[derive(Clone, Copy, Debug)]
pub struct GemmRaw {
    pub node: NodeId,
    pub location: Location,
    pub beta_c: Option<f32>,
    /// The raw result is the node's value (no `beta·C`, no bias to add): it is read, not
    /// computed.
    pub finished: bool,
}

/// What a kernel body is built from: buffers it touches and statements in order.
pub struct Body<'a> {
    pub plan: &'a Plan,
    pub members: HashSet<NodeId>,
    pub(super) gemm: Option<GemmRaw>,
    /// The memory it touches, in the order first used: each becomes a pointer parameter.
    buffers: Vec<Buffer>,
    pub statements: Vec<String>,
    /// `#include` lines the kernel needs (half types).
    pub headers: std::collections::BTreeSet<&'static str>,
    fresh: usize,
    /// Set when each thread computes several consecutive elements of the last axis.
    lanes: Option<Lanes>,
    /// Linear indices the kernel already has, by coordinates and shape (a thread's own
    /// element): a read or store there needs no index arithmetic. Only shapes with sizes that
    /// follow a range are entered, where the arithmetic would divide by run-time sizes.
    known: Vec<(Coords, Vec<SymDim>, String)>,
    /// The constants [`Body::evaluate`] wrote as expressions: the coordinates read and the
    /// pattern that stood in for the read.
    pub patterns: Vec<(Coords, Pattern)>,
    /// Set in a depthwise convolution's kernel that stages its input in shared memory
    /// (`codegen::depthwise`).
    pub(super) shared_depthwise: Option<super::depthwise::Tile>,
    /// Values this kernel stores and then reads back (the decoding attention's cache, which it
    /// appends to): read through their writable pointer, so that one parameter serves both.
    pub(super) read_back: HashSet<NodeId>,
}

/// A pointer parameter of a kernel: `{qualifier}{ty}* name`, pointing at `location`.
struct Buffer {
    name: String,
    pointee: String,
    location: Location,
}

mod lanes;
use lanes::Lanes;
pub(super) use lanes::{PackLoad, LANE, TILE_FIRST, TILE_OFFSET};

impl<'a> Body<'a> {
    pub fn new(plan: &'a Plan, kernel: &Kernel) -> Self {
        Body {
            plan,
            members: kernel.nodes.iter().copied().collect(),
            gemm: None,
            buffers: Vec::new(),
            statements: Vec::new(),
            headers: Default::default(),
            fresh: 0,
            lanes: None,
            known: Vec::new(),
            patterns: Vec::new(),
            shared_depthwise: None,
            read_back: HashSet::new(),
        }
    }

    /// The shape of `id` ([`Plan::dims`]).
    pub fn dims(&self, id: NodeId) -> Vec<SymDim> {
        self.plan.dims(id)
    }

    /// Notes that the element at `coords` of `shape` is at linear index `linear`, for a shape
    /// with a size that follows a range (see `known`).
    pub(super) fn know(&mut self, coords: &[String], shape: &Dims, linear: &str) {
        if shape.iter().any(|d| !d.is_static()) {
            self.known.push((coords.to_vec(), shape.to_vec(), linear.to_string()));
        }
    }

    /// The linear index of `coords` in `shape`.
    fn index_of(&self, coords: &[String], shape: &Dims) -> String {
        let known = self.known.iter().find(|(c, s, _)| c.as_slice() == coords && s.as_slice() == shape);
        match known {
            Some((_, _, linear)) => linear.clone(),
            None => linearize(coords, shape),
        }
    }

    fn location(&self, id: NodeId) -> Option<Location> {
        match self.gemm {
            Some(g) if g.node == id && g.finished => Some(g.location),
            // A value this kernel computes is never read back from memory.
            _ if self.members.contains(&id) => None,
            _ => self.plan.locations.get(&id).copied(),
        }
    }

    /// Whether this kernel computes `id` (rather than reading it).
    pub(super) fn computes(&self, id: NodeId) -> bool {
        self.members.contains(&id) && self.location(id).is_none()
    }

    /// The pointer variable for the memory of `id`, declared once.
    pub fn pointer(&mut self, id: NodeId, writable: bool) -> Result<String, String> {
        let location = self.location(id).or_else(|| self.plan.locations.get(&id).copied());
        let location =
            location.ok_or_else(|| format!("value '{}' has no memory", self.plan.graph.node(id).name))?;
        let writable = writable || self.read_back.contains(&id);
        let name = format!("{}{}", if writable { "out" } else { "in" }, id.index());
        self.declare(&name, location, self.plan.graph.node(id).ty.dtype, writable)?;
        Ok(name)
    }

    pub(super) fn declare(
        &mut self,
        name: &str,
        location: Location,
        dtype: DType,
        writable: bool,
    ) -> Result<(), String> {
        let ty = c_type(dtype)?;
        self.headers.extend(header(dtype));
        if !self.buffers.iter().any(|b| b.name == name) {
            let qualifier = if writable { "" } else { "const " };
            self.buffers.push(Buffer { name: name.into(), pointee: format!("{qualifier}{ty}"), location });
        }
        Ok(())
    }

    /// The element of `id` at `coords`, read from memory through views.
    pub fn read(&mut self, id: NodeId, coords: Coords) -> Result<String, String> {
        let graph = &self.plan.graph;
        let (source, coords) = self.stored_at(id, coords)?;
        let (shape, dtype) = (self.plan.stored_dims(source), graph.node(source).ty.dtype);
        let pointer = self.pointer(source, false)?;
        self.element(&pointer, &coords, &shape, dtype)
    }

    /// Where the element of `id` at `coords` is in memory: the stored value behind the views
    /// and its coordinates there.
    fn stored_at(&self, id: NodeId, coords: Coords) -> Result<(NodeId, Coords), String> {
        let graph = &self.plan.graph;
        let stored = |n: NodeId| self.location(n).is_some();
        trace_back(graph, &|n| self.plan.dims(n), id, coords, &stored)
            .ok_or_else(|| format!("'{}' is neither computed here nor stored", graph.node(id).name))
    }

    /// The address of the element of `id` at `coords` (`pointer + linear index`, through
    /// views) and the stored element type.
    pub fn address(&mut self, id: NodeId, coords: Coords) -> Result<(String, DType), String> {
        let graph = &self.plan.graph;
        let (source, coords) = self.stored_at(id, coords)?;
        let (shape, dtype) = (self.plan.stored_dims(source), graph.node(source).ty.dtype);
        let pointer = self.pointer(source, false)?;
        Ok((format!("({pointer} + {})", self.index_of(&coords, &shape)), dtype))
    }

    /// Whether reading `id` through its views, `pack` consecutive elements along `axis`
    /// starting at a multiple of `pack` are `pack` consecutive, `pack`-aligned elements in
    /// memory (so one vector access reads them).
    pub fn packs_along(&self, id: NodeId, axis: usize, pack: usize) -> bool {
        let graph = &self.plan.graph;
        let stored = |n: NodeId| self.location(n).is_some();
        super::index::packs_along(graph, &|n| self.plan.dims(n), id, axis, pack, &stored)
    }

    /// Input `input` of `consumer` (whose element is at `coords`), broadcast to it.
    pub fn operand(&mut self, consumer: NodeId, input: NodeId, coords: &Coords) -> Result<String, String> {
        let coords = broadcast(coords, &self.dims(consumer), &self.dims(input));
        self.value_at(input, coords)
    }

    /// The element of `input` at `coords` (of its own shape): a local if this kernel computes
    /// it on the same thread, else a read from memory.
    pub fn value_at(&mut self, input: NodeId, coords: Coords) -> Result<String, String> {
        // A value computed here, possibly behind reshapes (same linear index, same thread).
        let mut at = input;
        loop {
            if self.computes(at) {
                return Ok(format!("v{}", at.index()));
            }
            match self.plan.graph.node(at).op {
                Op::Reshape { .. } | Op::Identity | Op::Dropout if self.location(at).is_none() => {
                    at = self.plan.graph.inputs_of(at)[0];
                }
                _ => break,
            }
        }
        self.read(input, coords)
    }

    /// The element of `id` at `coords` (of its own shape), where this kernel computes `id`
    /// and the pointwise ops and views behind it from values in memory, at whatever element
    /// each needs (a broadcast input at the broadcast coordinates): a prologue evaluated
    /// anywhere, such as attention's mask at a score. Statements go to `statements`; each
    /// value is computed once per element (`seen`).
    pub fn evaluate(
        &mut self,
        id: NodeId,
        coords: Coords,
        seen: &mut HashMap<(NodeId, Coords), String>,
    ) -> Result<String, String> {
        let graph = &self.plan.graph;
        let computed = |n: NodeId| self.computes(n) && graph.node(n).op.is_pointwise();
        let stop = |n: NodeId| computed(n) || self.location(n).is_some();
        let (source, at) = trace_back(graph, &|n| self.plan.dims(n), id, coords, &stop)
            .ok_or_else(|| format!("'{}' is neither computed here nor stored", graph.node(id).name))?;
        let here = computed(source);
        if !here {
            // A constant of one value, or of one value on and below a diagonal and another
            // above it (a causal mask), is an expression of the coordinates: no memory read.
            return match self.plan.constant_pattern(source) {
                Some(pattern) => {
                    let expression = pattern.expression(&at, graph.node(source).ty.dtype);
                    self.patterns.push((at, pattern));
                    Ok(expression)
                }
                None => self.read(source, at),
            };
        }
        if let Some(name) = seen.get(&(source, at.clone())) {
            return Ok(name.clone());
        }
        let own = self.dims(source);
        let mut args = Vec::new();
        for input in graph.inputs_of(source) {
            let inner = broadcast(&at, &own, &self.dims(input));
            args.push(self.evaluate(input, inner, seen)?);
        }
        let node = graph.node(source);
        self.headers.extend(header(node.ty.dtype));
        let (ty, value) = (register_type(node.ty.dtype)?, pointwise(self.plan, source, &args)?);
        let name = self.fresh("e");
        self.statements.push(format!("const {ty} {name} = {value};"));
        seen.insert((source, at), name.clone());
        Ok(name)
    }

    /// Emits `idx<n>`, index `index` of an axis of `size` as node `id` reads it: negative counts
    /// from the end; outside the axis it is reported as `id`'s fault and 0 is read
    /// (`fusec::checked_index`; the bundle's table of checks names the node, [`index_fault_code`]).
    fn checked_index(&mut self, index: &str, size: &str, id: NodeId) -> String {
        let k = self.fresh("idx");
        let code = index_fault_code(id);
        self.statements.push(format!(
            "const long long {k} = fusec::checked_index((long long)({index}), {size}, {code}u);"
        ));
        k
    }

    pub(super) fn fresh(&mut self, prefix: &str) -> String {
        self.fresh += 1;
        format!("{prefix}{}", self.fresh)
    }

    /// Emits `v<id> = …` for node `id` at `coords`.
    pub fn compute(&mut self, id: NodeId, coords: &Coords) -> Result<(), String> {
        let graph = &self.plan.graph;
        let node = graph.node(id);
        let ty = register_type(node.ty.dtype)?;
        let inputs = graph.inputs_of(id);
        // Conversions to and from half types need their headers even with no half buffer.
        self.headers.extend(header(node.ty.dtype));
        let value = match &node.op {
            op if op.is_pointwise() => {
                let args = inputs
                    .iter()
                    .map(|&input| self.operand(id, input, coords))
                    .collect::<Result<Vec<_>, _>>()?;
                pointwise(self.plan, id, &args)?
            }
            // A reshape of a value computed here: the same element on the same thread.
            Op::Reshape { .. } if self.computes(inputs[0]) => format!("v{}", inputs[0].index()),
            op if op.is_view() => self.read(id, coords.clone())?,
            Op::Gather { axis } => {
                let indices = &graph.node(inputs[1]).ty.shape;
                let dim = self.dims(inputs[0])[*axis].c();
                let index_coords: Coords = coords[*axis..*axis + indices.len()].to_vec();
                let index = self.read(inputs[1], index_coords)?;
                let k = self.checked_index(&index, &dim, id);
                let mut data: Coords = coords[..*axis].to_vec();
                data.push(k);
                data.extend(coords[*axis + indices.len()..].iter().cloned());
                self.read(inputs[0], data)?
            }
            Op::GatherNd { batch_dims } => {
                let b = *batch_dims;
                let index_shape = &graph.node(inputs[1]).ty.shape;
                let (rows, depth) = (index_shape.len() - 1, index_shape[index_shape.len() - 1]);
                let dims = self.dims(inputs[0]);
                let mut data: Coords = coords[..b].to_vec();
                for t in 0..depth {
                    let mut at: Coords = coords[..rows].to_vec();
                    at.push(format!("{t}LL"));
                    let index = self.read(inputs[1], at)?;
                    let k = self.checked_index(&index, &dims[b + t].c(), id);
                    data.push(k);
                }
                data.extend(coords[rows..].iter().cloned());
                self.read(inputs[0], data)?
            }
            Op::GatherElements { axis } => {
                let dim = self.dims(inputs[0])[*axis].c();
                let index = self.read(inputs[1], coords.clone())?;
                let k = self.checked_index(&index, &dim, id);
                let mut data = coords.clone();
                data[*axis] = k;
                self.read(inputs[0], data)?
            }
            // Run over the new part only (`elementwise`): the coordinates are the new part's.
            Op::Append { .. } => self.read(inputs[1], coords.clone())?,
            Op::Concat { axis } => {
                let out = self.fresh("cat");
                self.statements.push(format!("{ty} {out};"));
                // Where each input starts along the axis: a sum of sizes.
                let mut start: Vec<SymDim> = Vec::new();
                let sum = |terms: &[SymDim]| {
                    let fixed: usize = terms.iter().filter_map(SymDim::value).sum();
                    let mut parts: Vec<String> =
                        terms.iter().filter(|d| !d.is_static()).map(SymDim::c).collect();
                    if parts.is_empty() {
                        return format!("{fixed}LL");
                    }
                    if fixed > 0 {
                        parts.push(format!("{fixed}LL"));
                    }
                    format!("({})", parts.join(" + "))
                };
                let c = &coords[*axis];
                for (n, &input) in inputs.iter().enumerate() {
                    let len = self.dims(input)[*axis].clone();
                    let mut inner = coords.clone();
                    let first = sum(&start);
                    inner[*axis] = format!("({c} - {first})");
                    start.push(len);
                    let end = sum(&start);
                    let (test, inside) = match (n, n + 1 == inputs.len()) {
                        (0, true) => (String::new(), None),
                        (_, true) => ("else".to_string(), Some(format!("{c} >= {first}"))),
                        (0, false) => (format!("if ({c} < {end})"), Some(format!("{c} < {end}"))),
                        (_, false) => {
                            (format!("else if ({c} < {end})"), Some(format!("{c} >= {first} && {c} < {end}")))
                        }
                    };
                    // In a lane loop, packs this part loads are loaded only where it is read.
                    let read = self.guarded(inside, |body| body.read(input, inner))?;
                    self.statements.push(format!("{test} {out} = {read};"));
                }
                out
            }
            // concat(-x[.., h:], x[.., :h]): x is read from memory (the partition never
            // computes it in the same kernel); only the selected read runs.
            Op::RotateHalf => {
                let last = coords.len().checked_sub(1).ok_or("RotateHalf of a scalar")?;
                let half = self.dims(id)[last]
                    .div_exact(2)
                    .and_then(|h| h.value())
                    .ok_or("RotateHalf of an axis whose size follows a range")?;
                let c = coords[last].clone();
                let mut upper = coords.clone();
                upper[last] = format!("({c} + {half}LL)");
                let mut lower = coords.clone();
                lower[last] = format!("({c} - {half}LL)");
                let (upper, lower) = (self.read(inputs[0], upper)?, self.read(inputs[0], lower)?);
                format!("(({c} < {half}LL) ? -({upper}) : ({lower}))")
            }
            Op::Tile { .. } => {
                let in_shape = self.dims(inputs[0]);
                let inner = coords.iter().zip(&in_shape).map(|(c, d)| format!("({c} % {})", d.c())).collect();
                self.read(inputs[0], inner)?
            }
            Op::Trilu { upper, k } => {
                let x = self.operand(id, inputs[0], coords)?;
                let r = coords.len();
                let diff = format!("({} - {})", coords[r - 1], coords[r - 2]);
                let keep = if *upper { format!("{diff} >= {k}LL") } else { format!("{diff} <= {k}LL") };
                format!("(({keep}) ? {x} : ({ty})0)")
            }
            Op::Reduce { op, axes, keep_dims } => self.reduce_loop(id, *op, axes, *keep_dims, coords)?,
            Op::CumSum { axis, exclusive, reverse } => {
                let n = self.dims(inputs[0])[*axis].c();
                let (acc, q) = (self.fresh("sum"), self.fresh("q"));
                let c = &coords[*axis];
                let range = match (reverse, exclusive) {
                    (false, false) => format!("{q} = 0; {q} <= {c}; ++{q}"),
                    (false, true) => format!("{q} = 0; {q} < {c}; ++{q}"),
                    (true, false) => format!("{q} = {c}; {q} < {n}; ++{q}"),
                    (true, true) => format!("{q} = {c} + 1; {q} < {n}; ++{q}"),
                };
                let mut inner = coords.clone();
                inner[*axis] = q.clone();
                let read = self.read(inputs[0], inner)?;
                self.statements.push(format!("{ty} {acc} = 0; for (long long {range}) {acc} += {read};"));
                acc
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let log = matches!(node.op, Op::LogSoftmax { .. });
                let n = self.dims(id)[*axis].c();
                let (mx, sum, q) = (self.fresh("mx"), self.fresh("sum"), self.fresh("q"));
                let mut inner = coords.clone();
                inner[*axis] = q.clone();
                let element = self.read(inputs[0], inner)?;
                let own = self.read(inputs[0], coords.clone())?;
                self.statements.push(format!(
                    "float {mx} = -fusec::inf(); for (long long {q} = 0; {q} < {n}; ++{q}) {mx} = fmaxf({mx}, {element});"
                ));
                self.statements.push(format!(
                    "float {sum} = 0.0f; for (long long {q} = 0; {q} < {n}; ++{q}) {sum} += expf({element} - {mx});"
                ));
                if log {
                    format!("({own} - {mx} - logf({sum}))")
                } else {
                    format!("(expf({own} - {mx}) / {sum})")
                }
            }
            // A library convolution wrote its result without the bias, at the element's own
            // linear index.
            Op::Conv { .. } if self.gemm.is_some_and(|g| g.node == id) => {
                self.library_conv_value(id, coords)?
            }
            Op::Conv { strides, pads, dilations, group, channels_last } => {
                self.conv_loop(id, coords, *strides, *pads, *dilations, (*group, *channels_last))?
            }
            Op::Pool { kind, window } => self.pool_loop(id, coords, *kind, window)?,
            Op::MatMul | Op::Gemm { .. } => {
                let gemm = self.gemm.filter(|g| g.node == id).ok_or("a GEMM inside an elementwise kernel")?;
                let raw = format!("raw{}", id.index());
                // The raw product is never stored through a view, so the element is at its
                // own linear index.
                self.declare(&raw, gemm.location, node.ty.dtype, false)?;
                let (shape, dtype) = (self.dims(id), node.ty.dtype);
                let raw = self.element(&raw, coords, &shape, dtype)?;
                match (gemm.beta_c, inputs.get(2)) {
                    (Some(beta), Some(&c)) => {
                        let c = self.operand(id, c, coords)?;
                        format!("({raw} + {} * {c})", literal(f64::from(beta), DType::F32))
                    }
                    _ => raw,
                }
            }
            other => return Err(format!("no elementwise code for {}", other.kind())),
        };
        self.statements.push(format!("const {ty} v{} = {value};", id.index()));
        Ok(())
    }

    fn reduce_loop(
        &mut self,
        id: NodeId,
        op: ReduceOp,
        axes: &[usize],
        keep_dims: bool,
        coords: &Coords,
    ) -> Result<String, String> {
        let graph = &self.plan.graph;
        let input = graph.inputs_of(id)[0];
        let in_shape = self.dims(input);
        let reduced: Vec<SymDim> = axes.iter().map(|&a| in_shape[a].clone()).collect();
        let count = SymDim::product(&reduced);
        let (acc, q) = (self.fresh("acc"), self.fresh("q"));
        let inner_coords = delinearize(&q, &reduced);
        let mut kept = coords.iter();
        let mut inner = Vec::with_capacity(in_shape.len());
        for d in 0..in_shape.len() {
            match axes.iter().position(|&a| a == d) {
                Some(k) => {
                    inner.push(inner_coords[k].clone());
                    if keep_dims {
                        kept.next();
                    }
                }
                None => inner.push(kept.next().cloned().unwrap_or_else(|| "0".into())),
            }
        }
        let read = self.read(input, inner)?;
        let (init, step) = match op {
            ReduceOp::Max => ("-fusec::inf()".to_string(), format!("{acc} = fmaxf({acc}, {read})")),
            _ => ("0.0f".to_string(), format!("{acc} += {read}")),
        };
        self.statements.push(format!(
            "float {acc} = {init}; for (long long {q} = 0; {q} < {}; ++{q}) {step};",
            count.c()
        ));
        let mean = match count.value() {
            Some(n) => format!("({acc} / {n}.0f)"),
            None => format!("({acc} / (float){})", count.c()),
        };
        Ok(if op == ReduceOp::Mean { mean } else { acc })
    }

    /// Stores `v<id>` (at `coords` of `id`'s shape) where the plan keeps it.
    pub fn store(&mut self, kernel: &Kernel, id: NodeId, coords: &Coords) -> Result<(), String> {
        let graph = &self.plan.graph;
        let (target, index) = self
            .store_target(kernel, id, coords)
            .ok_or("store through a view that is not a reshape/transpose chain")?;
        let (shape, dtype) = (self.dims(id), graph.node(id).ty.dtype);
        let pointer = self.pointer(target, true)?;
        // Packs where the lanes are consecutive in memory: in the value's own layout, or in a
        // view's whose chain keeps the last axis last (a row order transposed, patches).
        let packs_through = |count: usize| {
            target != id && super::index::stores_pack_along(graph, &|n| self.plan.dims(n), id, target, count)
        };
        let base = match (self.lane_base(coords, &shape), self.lanes.as_ref().map(|l| l.count)) {
            (Some(b), _) if target == id => Some(self.index_of(&b, &shape)),
            (Some(b), Some(count)) if packs_through(count) => {
                self.store_target(kernel, id, &b).map(|(_, at)| at)
            }
            _ => None,
        };
        self.write(id, dtype, &pointer, base, &index)
    }

    /// Stores `id`'s element at `coords` of `view`, the layout it is stored in, in a kernel
    /// that runs over that layout: its threads' lanes are consecutive there.
    pub(super) fn store_in_layout(
        &mut self,
        id: NodeId,
        view: NodeId,
        coords: &Coords,
    ) -> Result<(), String> {
        let (shape, dtype) = (self.dims(view), self.plan.graph.node(id).ty.dtype);
        let pointer = self.pointer(view, true)?;
        let base = self.lane_base(coords, &shape).map(|b| self.index_of(&b, &shape));
        let index = self.index_of(coords, &shape);
        self.write(id, dtype, &pointer, base, &index)
    }

    /// Writes `id`'s value at `pointer[index]`; in a lane loop where `base` is the first lane's
    /// index, as one pack after the loop.
    fn write(
        &mut self,
        id: NodeId,
        dtype: DType,
        pointer: &str,
        base: Option<String>,
        index: &str,
    ) -> Result<(), String> {
        let value = narrow(&format!("v{}", id.index()), dtype);
        match (base, self.lanes.as_mut()) {
            (Some(base), Some(lanes)) => {
                let (ty, n) = (c_type(dtype)?, lanes.count);
                let pack = format!("s{}", id.index());
                lanes.before.push(format!("fusec::Pack<{ty}, {n}> {pack};"));
                lanes.after.push(format!(
                    "*reinterpret_cast<fusec::Pack<{ty}, {n}>*>({pointer} + {base}) = {pack};"
                ));
                self.statements.push(format!("{pack}.v[j] = {value};"));
            }
            _ => self.statements.push(format!("{pointer}[{index}] = {value};")),
        }
        Ok(())
    }

    /// Where `kernel` stores `id`'s element at `coords`: the stored value (`id`, or the view
    /// it is stored in the layout of) and the linear index there. `None` for a store view
    /// that is not a chain of reshapes and transposes.
    fn store_target(&self, kernel: &Kernel, id: NodeId, coords: &Coords) -> Option<(NodeId, String)> {
        let plan = self.plan;
        match kernel.store_views.iter().find(|(v, _)| *v == id) {
            Some(&(_, view)) => {
                Some((view, trace_forward(&plan.graph, &|n| plan.dims(n), id, view, coords.clone())?))
            }
            None => Some((id, self.index_of(coords, &plan.dims(id)))),
        }
    }

    /// The address [`Body::store`] writes `id`'s element at `coords` to, where `pack`
    /// consecutive elements of the last axis from there (the last coordinate a multiple of
    /// `pack`) are one aligned run in memory: for a vector store of them.
    pub fn store_address(
        &mut self,
        kernel: &Kernel,
        id: NodeId,
        coords: &Coords,
        pack: usize,
    ) -> Result<Option<String>, String> {
        let graph = &self.plan.graph;
        let Some((target, index)) = self.store_target(kernel, id, coords) else { return Ok(None) };
        if !super::index::stores_pack_along(graph, &|n| self.plan.dims(n), id, target, pack) {
            return Ok(None);
        }
        let pointer = self.pointer(target, true)?;
        Ok(Some(format!("({pointer} + {index})")))
    }
}

impl Pattern {
    /// The element at `coords` (of the constant's shape) as a C expression of `dtype`.
    fn expression(&self, coords: &[String], dtype: DType) -> String {
        match *self {
            Pattern::Uniform(v) => literal(v, dtype),
            Pattern::Lower { k, inside, outside } => {
                let (row, column) = (&coords[coords.len() - 2], &coords[coords.len() - 1]);
                let (inside, outside) = (literal(inside, dtype), literal(outside, dtype));
                format!("((({column}) - ({row}) <= {k}LL) ? {inside} : {outside})")
            }
        }
    }
}

/// The C expression of pointwise node `id` on its inputs' values `args`.
fn pointwise(plan: &Plan, id: NodeId, args: &[String]) -> Result<String, String> {
    let graph = &plan.graph;
    let node = graph.node(id);
    let in_dtype = graph.inputs_of(id).first().map_or(node.ty.dtype, |&i| graph.node(i).ty.dtype);
    let arg =
        |i: usize| args.get(i).map(String::as_str).ok_or_else(|| format!("{} lacks input {i}", node.name));
    Ok(match &node.op {
        Op::Unary(op) => unary(*op, arg(0)?, in_dtype),
        Op::Binary(op) => binary(*op, arg(0)?, arg(1)?, in_dtype),
        Op::Where => format!("({} ? {} : {})", arg(0)?, arg(1)?, arg(2)?),
        Op::Cast { to } => cast(arg(0)?, in_dtype, *to)?,
        Op::Clip { min, max } => {
            let (lo, hi) = (literal(*min, node.ty.dtype), literal(*max, node.ty.dtype));
            format!("fusec::minimum(fusec::maximum({}, {lo}), {hi})", arg(0)?)
        }
        other => return Err(format!("{} is not a pointwise op", other.kind())),
    })
}

/// The kernel's parameter list: one pointer per buffer, `__restrict__` unless another
/// parameter points at the same memory (a GEMM epilogue writes over the product it reads).
pub(super) fn params(body: &Body<'_>) -> String {
    let shared = |b: &Buffer| body.buffers.iter().filter(|o| o.location == b.location).count() > 1;
    let list: Vec<String> = body
        .buffers
        .iter()
        .map(|b| {
            let restrict = if shared(b) { "" } else { " __restrict__" };
            format!("{}*{restrict} {}", b.pointee, b.name)
        })
        .collect();
    list.join(", ")
}

/// Where each parameter of [`params`] points, in order: the launch's arguments.
pub(super) fn args(body: &Body<'_>) -> Vec<Location> {
    body.buffers.iter().map(|b| b.location).collect()
}

pub(super) fn coords_decl(prefix: &str, linear: &str, shape: &Dims) -> (Vec<String>, Coords) {
    let exprs = delinearize(linear, shape);
    let names: Coords = (0..shape.len()).map(|d| format!("{prefix}{d}")).collect();
    let decls = names.iter().zip(&exprs).map(|(n, e)| format!("const long long {n} = {e};")).collect();
    (decls, names)
}

pub(super) fn render(
    hb: &Handlebars<'_>,
    template: &str,
    data: &serde_json::Value,
) -> Result<String, String> {
    hb.render(template, data).map_err(|e| format!("rendering {template}: {e}"))
}

#[cfg(test)]
mod tests {
    use crate::ir::{DType, Tensor};
    use crate::plan::{pattern, Pattern};

    fn tensor(shape: &[usize], f: impl Fn(usize, usize) -> f64) -> Tensor {
        let (rows, columns) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        let values: Vec<f64> =
            (0..shape.iter().product()).map(|p| f(p / columns % rows, p % columns)).collect();
        Tensor::from_f64(ndarray::ArrayD::from_shape_vec(shape, values).unwrap(), DType::F32)
    }

    /// Causal matrices (also strict, also several of them, also upper ones) are `Lower`; one
    /// value throughout is `Uniform`; anything else, even one element off, is no pattern.
    #[test]
    fn constants_that_follow_a_pattern_are_found() {
        assert_eq!(pattern(&tensor(&[1, 4, 4], |_, _| -2.5)), Some(Pattern::Uniform(-2.5)));
        let causal = |i: usize, j: usize| f64::from(u8::from(j <= i));
        assert_eq!(
            pattern(&tensor(&[2, 1, 5, 7], causal)),
            Some(Pattern::Lower { k: 0, inside: 1.0, outside: 0.0 })
        );
        let strict = |i: usize, j: usize| if j < i { 0.0 } else { -1e9 };
        assert_eq!(
            pattern(&tensor(&[5, 5], strict)),
            Some(Pattern::Lower { k: -1, inside: 0.0, outside: -1e9 })
        );
        let upper = |i: usize, j: usize| f64::from(u8::from(j >= i));
        // The upper triangle of ones is zeros below the diagonal.
        assert_eq!(
            pattern(&tensor(&[5, 5], upper)),
            Some(Pattern::Lower { k: -1, inside: 0.0, outside: 1.0 })
        );
        let off = |i: usize, j: usize| f64::from(u8::from(j <= i || (i, j) == (1, 4)));
        assert_eq!(pattern(&tensor(&[5, 5], off)), None);
        let expression = Pattern::Lower { k: 0, inside: 1.0, outside: 0.0 }
            .expression(&["b".into(), "s".into(), "t".into()], DType::Bool);
        assert_eq!(expression, "(((t) - (s) <= 0LL) ? true : false)");
    }
}
