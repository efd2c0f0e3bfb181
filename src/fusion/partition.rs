//! The partition: which nodes of a (fused) graph run together as one kernel launch.
//!
//! In order: each GEMM takes its epilogue (a chain of bias adds and activations on its
//! output); attention is one kernel; each row op (LayerNorm, RMSNorm, softmax, last-axis
//! reductions) takes its pointwise prologue and epilogue; the remaining pointwise nodes form
//! groups over one iteration space. Layout ops are views that cost no launch when their
//! readers can index through them (or their producer can store through them); otherwise a
//! copy kernel materialises them. A node joins a kernel only if that keeps the kernels
//! acyclic. A value used outside its kernel, or a graph output, is one of its outputs.

mod appends;
mod conv_epilogue;
mod merge;
mod widening;

pub use appends::{append_behind, decoding_takes_appends};

use std::collections::{HashMap, HashSet};

use crate::ir::{Graph, NodeId, Op, UnaryOp};

/// What a kernel is, which decides how it is generated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// A cuBLAS(Lt) GEMM, with the ops of its epilogue (bias, activation).
    Gemm {
        /// The epilogue's ops, in order (`bias`, `gelu`).
        epilogue: Vec<String>,
    },
    /// Fused attention: the scores never leave the kernel.
    Attention,
    /// A row reduction (LayerNorm, RMSNorm, softmax, …) with pointwise prologue/epilogue.
    RowReduction {
        /// The reduction (`LayerNorm`, `Softmax`, …).
        op: String,
    },
    /// A group of pointwise ops over one iteration space.
    Pointwise,
    /// Embedding lookup.
    Gather,
    /// A convolution.
    Conv,
    /// A layout change no neighbour can absorb, written out.
    Copy,
    /// Any other op, one kernel of its own.
    Single {
        /// The op's name.
        op: String,
    },
}

impl KernelKind {
    /// The kind's name in kernel names and reports (`gemm+bias+gelu`, `row:LayerNorm`).
    pub fn name(&self) -> String {
        match self {
            KernelKind::Gemm { epilogue } if epilogue.is_empty() => "gemm".into(),
            KernelKind::Gemm { epilogue } => format!("gemm+{}", epilogue.join("+")),
            KernelKind::Attention => "attention".into(),
            KernelKind::RowReduction { op } => format!("row:{op}"),
            KernelKind::Pointwise => "pointwise".into(),
            KernelKind::Gather => "gather".into(),
            KernelKind::Conv => "conv".into(),
            KernelKind::Copy => "copy".into(),
            KernelKind::Single { op } => op.to_lowercase(),
        }
    }
}

/// One kernel of the partition: a launch (or GEMM call) computing some of the graph's nodes.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// What it is.
    pub kind: KernelKind,
    /// The nodes it computes, in topological order.
    pub nodes: Vec<NodeId>,
    /// The values it writes to memory.
    pub outputs: Vec<NodeId>,
    /// The ONNX nodes it covers.
    pub covers: Vec<String>,
    /// `(value, view)`: the kernel writes `value` in the layout of `view`, a chain of reshapes
    /// and transposes of it, so that `view`'s readers find it contiguous.
    pub store_views: Vec<(NodeId, NodeId)>,
}

/// The fused graph cut into kernels.
#[derive(Clone, Debug)]
pub struct Partition {
    /// In an order that respects data dependencies.
    pub kernels: Vec<Kernel>,
    /// Layout nodes that cost no launch.
    pub views: Vec<NodeId>,
    /// Points where the GPU path stops (host round trips, CPU fallbacks). Every IR op has a
    /// GPU kernel and every shape is static, so the partition never makes one.
    pub graph_breaks: usize,
}

impl Partition {
    /// Kernels (a GEMM with its epilogue counts once).
    pub fn launches(&self) -> usize {
        self.kernels.len()
    }

    /// Kernels that are GEMMs.
    pub fn gemm_calls(&self) -> usize {
        self.kernels.iter().filter(|k| matches!(k.kind, KernelKind::Gemm { .. })).count()
    }

    /// Kernels whose kind `pred` accepts.
    pub fn count(&self, pred: impl Fn(&KernelKind) -> bool) -> usize {
        self.kernels.iter().filter(|k| pred(&k.kind)).count()
    }
}

/// How to partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Fuse as described above.
    Fused,
    /// One kernel per node (GEMMs on cuBLAS, reshapes free): the unfused baseline.
    OneKernelPerNode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    None,
    View,
    Gemm,
    Attention,
    Row,
    Pointwise,
    Gather,
    Conv,
    Single,
}

fn role(graph: &Graph, id: NodeId) -> Role {
    let node = graph.node(id);
    let last_axis = |axis: usize| axis + 1 == node.ty.rank();
    match &node.op {
        Op::Input { .. } | Op::Constant(_) => Role::None,
        op if op.is_view() => Role::View,
        Op::MatMul | Op::Gemm { .. } => Role::Gemm,
        Op::Attention { .. } => Role::Attention,
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => Role::Row,
        Op::Softmax { axis } | Op::LogSoftmax { axis } if last_axis(*axis) => Role::Row,
        Op::Reduce { axes, .. }
            if axes.len() == 1 && axes[0] + 1 == graph.node(graph.inputs_of(id)[0]).ty.rank() =>
        {
            Role::Row
        }
        op if op.is_pointwise() => Role::Pointwise,
        // Both read their input at other coordinates, from memory (`reads_across`); a Tile
        // only with `FUSEC_REPEATS_AS_TILES=1` (`passes::RepeatsAsTiles`: correct on an H200,
        // no faster), else a kernel of its own.
        Op::RotateHalf => Role::Pointwise,
        Op::Tile { .. } if crate::knobs::on("FUSEC_REPEATS_AS_TILES") => Role::Pointwise,
        Op::Gather { .. } => Role::Gather,
        Op::Conv { .. } => Role::Conv,
        _ => Role::Single,
    }
}

struct Builder<'a> {
    graph: &'a Graph,
    order: Vec<NodeId>,
    position: HashMap<NodeId, usize>,
    roles: HashMap<NodeId, Role>,
    kernel_of: HashMap<NodeId, usize>,
    kinds: Vec<KernelKind>,
    outputs: HashSet<NodeId>,
    store_views: Vec<(NodeId, NodeId)>,
}

impl Builder<'_> {
    fn new_kernel(&mut self, kind: KernelKind, anchor: NodeId) -> usize {
        self.kinds.push(kind);
        let k = self.kinds.len() - 1;
        self.kernel_of.insert(anchor, k);
        k
    }

    fn free_pointwise(&self, id: NodeId) -> bool {
        self.roles[&id] == Role::Pointwise && !self.kernel_of.contains_key(&id)
    }

    /// Whether a walk from `from` — downstream through users, or upstream through inputs —
    /// meets a node of kernel `k`.
    fn meets_kernel(&self, from: Vec<NodeId>, k: usize, downstream: bool) -> bool {
        let mut stack = from;
        let mut seen = HashSet::new();
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            if self.kernel_of.get(&n) == Some(&k) {
                return true;
            }
            stack.extend(if downstream { self.graph.users_of(n) } else { self.graph.inputs_of(n) });
        }
        false
    }

    /// Whether `id` in kernel `k` would put a value and a reader of other elements of it
    /// (the rotate-half) in one kernel: such a reader finds its input in memory only.
    fn reads_across(&self, id: NodeId, k: usize) -> bool {
        let across = |n: NodeId| matches!(self.graph.node(n).op, Op::RotateHalf | Op::Tile { .. });
        let produced_in_k = |n: NodeId| producer_kernel(self, n) == Some(k);
        if across(id) && self.graph.inputs_of(id).into_iter().any(produced_in_k) {
            return true;
        }
        // Readers of `id`, looking through views.
        let mut stack = self.graph.users_of(id);
        while let Some(u) = stack.pop() {
            if self.roles[&u] == Role::View && !self.kernel_of.contains_key(&u) {
                stack.extend(self.graph.users_of(u));
            } else if across(u) && self.kernel_of.get(&u) == Some(&k) {
                return true;
            }
        }
        false
    }

    /// Adds `id` (upstream of kernel `k`) to `k` unless a path from `id` leaves `k` and comes
    /// back: then the kernels would wait on each other.
    fn try_absorb_upstream(&mut self, id: NodeId, k: usize) -> bool {
        let outside: Vec<NodeId> =
            self.graph.users_of(id).into_iter().filter(|u| self.kernel_of.get(u) != Some(&k)).collect();
        if self.reads_across(id, k) || self.meets_kernel(outside, k, true) {
            return false;
        }
        self.kernel_of.insert(id, k);
        true
    }

    /// Adds `id` (downstream of kernel `k`) to `k` unless one of its other inputs depends on `k`.
    fn try_absorb_downstream(&mut self, id: NodeId, k: usize) -> bool {
        let others: Vec<NodeId> =
            self.graph.inputs_of(id).into_iter().filter(|i| self.kernel_of.get(i) != Some(&k)).collect();
        if self.reads_across(id, k) || self.meets_kernel(others, k, false) {
            return false;
        }
        self.kernel_of.insert(id, k);
        true
    }

    fn single_user(&self, id: NodeId) -> Option<NodeId> {
        match self.graph.users_of(id)[..] {
            [u] if !self.outputs.contains(&id) => Some(u),
            _ => None,
        }
    }

    fn gemm_epilogue(&mut self, gemm: NodeId, k: usize) -> Vec<String> {
        let mut epilogue = Vec::new();
        let mut tail = gemm;
        // Reshapes between epilogue ops join the kernel once an op behind them does.
        let mut reshapes = Vec::new();
        while let Some(u) = self.single_user(tail) {
            let node = self.graph.node(u);
            // A reshape changes no element: the epilogue continues behind it.
            if matches!(node.op, Op::Reshape { .. }) {
                reshapes.push(u);
                tail = u;
                continue;
            }
            let same_shape = node.ty.shape == self.graph.node(tail).ty.shape;
            let step = match &node.op {
                Op::Unary(
                    op @ (UnaryOp::Gelu
                    | UnaryOp::GeluTanh
                    | UnaryOp::Relu
                    | UnaryOp::Tanh
                    | UnaryOp::Sigmoid),
                ) => Some(format!("{op:?}").to_lowercase()),
                Op::Binary(crate::ir::BinaryOp::Add) => {
                    let inputs = self.graph.inputs_of(u);
                    let other = if inputs[0] == tail { inputs[1] } else { inputs[0] };
                    let width = node.ty.shape.last().copied();
                    match self.graph.constant(other) {
                        Some(c) => {
                            (c.shape().last().copied() == width || c.len() == 1).then(|| "bias".to_string())
                        }
                        None => {
                            self.gemm_residual(gemm, u, other, &epilogue, k).then(|| "residual".to_string())
                        }
                    }
                }
                // A uniform factor right after the product: cuBLASLt's α.
                Op::Binary(crate::ir::BinaryOp::Mul) if epilogue.is_empty() => {
                    let inputs = self.graph.inputs_of(u);
                    let other = if inputs[0] == tail { inputs[1] } else { inputs[0] };
                    uniform_constant(self.graph, other).then(|| "scale".to_string())
                }
                Op::Cast { .. } if epilogue.is_empty() && self.widens_product(gemm, tail, u) => {
                    Some(widening::WIDENED.to_string())
                }
                _ => None,
            };
            match step {
                Some(name) if same_shape && self.free_pointwise(u) => {
                    for r in reshapes.drain(..) {
                        self.kernel_of.insert(r, k);
                    }
                    self.kernel_of.insert(u, k);
                    let last = name == widening::WIDENED;
                    epilogue.push(name);
                    tail = u;
                    // The product is stored widened: nothing follows in this kernel.
                    if last {
                        break;
                    }
                }
                _ => break,
            }
        }
        epilogue
    }

    /// Whether `add` (of the GEMM's result, scaled or biased, and `other`) joins GEMM `gemm`'s
    /// kernel as a residual, which cuBLASLt adds as `β·C`: before any activation, a stored
    /// value of the result's type computed before the GEMM, and not read by a row reduction
    /// (a LayerNorm takes the sum in its prologue, at no extra pass) but a norm whose scale was
    /// folded into the products after it (`passes::FoldNormScales`): a kernel for a few rows
    /// folds such a norm in, and reads its input in fewer trips where that is one value, not
    /// the sum of two.
    fn gemm_residual(&self, gemm: NodeId, add: NodeId, other: NodeId, epilogue: &[String], k: usize) -> bool {
        let graph = self.graph;
        epilogue.iter().all(|step| step == "bias" || step == "scale")
            && graph.node(other).ty == graph.node(add).ty
            && self.position.get(&other).is_some_and(|&p| p < self.position[&gemm])
            && graph.users_of(add).iter().all(|&u| self.roles[&u] != Role::Row || folded_norm(graph, u))
            && !self.meets_kernel(vec![other], k, false)
    }

    fn row_prologue(&mut self, row: NodeId, k: usize) {
        let input = self.graph.inputs_of(row)[0];
        let shape = self.graph.node(input).ty.shape.clone();
        let mut stack = vec![input];
        while let Some(p) = stack.pop() {
            if !self.free_pointwise(p) || self.graph.node(p).ty.shape != shape {
                continue;
            }
            if self.try_absorb_upstream(p, k) {
                stack.extend(self.graph.inputs_of(p));
            }
        }
    }

    fn row_epilogue(&mut self, row: NodeId, k: usize) {
        let mut tail = row;
        while let Some(u) = self.single_user(tail) {
            if !self.free_pointwise(u) || self.graph.node(u).ty.shape != self.graph.node(tail).ty.shape {
                break;
            }
            if !self.try_absorb_downstream(u, k) {
                break;
            }
            tail = u;
        }
        // Casts of the row's values (an f32 LayerNorm output cast to bf16 for the next GEMM),
        // also behind a reshape that only the cast reads, join it as extra outputs even where
        // the value has other readers.
        for n in [row, tail] {
            for u in self.graph.users_of(n) {
                let reshape =
                    matches!(self.graph.node(u).op, Op::Reshape { .. }) && !self.kernel_of.contains_key(&u);
                match self.single_user(u) {
                    Some(cast) if reshape && self.absorbable_cast(cast) => {
                        self.kernel_of.insert(u, k);
                        if !self.try_absorb_downstream(cast, k) {
                            self.kernel_of.remove(&u);
                        }
                    }
                    _ if self.absorbable_cast(u) => {
                        self.try_absorb_downstream(u, k);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Attention `id` (kernel `k`) computes its mask where the mask is a few pointwise ops
    /// on graph inputs and constants that nothing else reads ([`crate::passes::mask_prologue`]).
    fn mask_prologue(&mut self, id: NodeId, k: usize) {
        let Some(prologue) = crate::passes::mask_prologue(self.graph, id) else { return };
        let free = prologue.iter().all(|n| !self.kernel_of.contains_key(n));
        if free && crate::passes::owns_prologue(self.graph, id, &prologue, &self.outputs) {
            for n in prologue.into_iter().filter(|&n| self.roles[&n] == Role::Pointwise) {
                self.kernel_of.insert(n, k);
            }
        }
    }

    fn absorbable_cast(&self, id: NodeId) -> bool {
        matches!(self.graph.node(id).op, Op::Cast { .. }) && self.free_pointwise(id)
    }

    fn pointwise_group(&mut self, id: NodeId) {
        let shape = &self.graph.node(id).ty.shape;
        let candidates: Vec<usize> = self
            .graph
            .inputs_of(id)
            .into_iter()
            .filter(|&i| self.roles[&i] == Role::Pointwise && self.graph.node(i).ty.shape == *shape)
            .filter_map(|i| self.kernel_of.get(&i).copied())
            .filter(|&k| self.kinds[k] == KernelKind::Pointwise)
            .collect();
        // A convolution's kernel takes the pointwise ops after it as its epilogue (cuDNN's
        // fused bias and activation, or the epilogue kernel over its result) where the value
        // they read is read by nothing else, so the kernel keeps one output — of the
        // convolution's type: cuDNN writes its raw result where the kernel's output goes (a
        // cast to another type, a half-type network's f32 output, runs after it).
        let conv = self
            .graph
            .inputs_of(id)
            .into_iter()
            .filter(|&i| self.graph.node(i).ty == self.graph.node(id).ty && self.single_user(i) == Some(id))
            .filter_map(|i| self.kernel_of.get(&i).copied())
            .find(|&k| self.kinds[k] == KernelKind::Conv);
        if let Some(k) = conv {
            if self.try_absorb_downstream(id, k) {
                return;
            }
        }
        if self.closed_conv_epilogue(id) {
            return;
        }
        let Some(k) = candidates.iter().copied().find(|&k| self.try_absorb_downstream(id, k)) else {
            self.new_kernel(KernelKind::Pointwise, id);
            return;
        };
        // The other groups `id` reads (x·cos and rotate_half(x)·sin meeting in an add) join
        // it where that keeps the kernels acyclic.
        for other in candidates {
            if other != k {
                self.try_merge(other, k);
            }
        }
    }

    /// The chain of views ending at `view` (its first element is the materialised source).
    fn view_chain(&self, view: NodeId) -> (NodeId, Vec<NodeId>) {
        let mut chain = vec![view];
        let mut source = self.graph.inputs_of(view)[0];
        while self.roles[&source] == Role::View {
            chain.push(source);
            source = self.graph.inputs_of(source)[0];
        }
        chain.reverse();
        (source, chain)
    }

    /// cuBLAS reads an operand through a reshape, a transpose of the last two axes (the op
    /// flag), or a slice of the last axis (the leading dimension).
    fn gemm_reads_through(&self, chain: &[NodeId]) -> bool {
        chain.iter().all(|&v| match &self.graph.node(v).op {
            Op::Reshape { .. } | Op::Identity | Op::Dropout => true,
            Op::Transpose { perm } => {
                let n = perm.len();
                n >= 2 && perm[..n - 2].iter().enumerate().all(|(i, &p)| i == p) && perm[n - 2] == n - 1
            }
            Op::Slice { axes } => {
                let input = &self.graph.node(self.graph.inputs_of(v)[0]).ty.shape;
                axes[..axes.len() - 1]
                    .iter()
                    .zip(input)
                    .all(|(a, &d)| a.start == 0 && a.step == 1 && a.len == d)
                    && axes.last().is_some_and(|a| a.step == 1)
            }
            _ => false,
        })
    }

    /// The view chain is the only reader of a non-GEMM kernel's output: that kernel can store
    /// in the layout the chain describes.
    fn producer_stores_through(&self, source: NodeId, chain: &[NodeId]) -> bool {
        let producer_ok = self.kernel_of.get(&source).is_some_and(|&k| {
            matches!(
                self.kinds[k],
                KernelKind::Attention | KernelKind::Pointwise | KernelKind::RowReduction { .. }
            )
        });
        let permutes_only =
            chain.iter().all(|&v| matches!(self.graph.node(v).op, Op::Reshape { .. } | Op::Transpose { .. }));
        let linear = std::iter::once(source)
            .chain(chain[..chain.len() - 1].iter().copied())
            .all(|n| self.graph.users_of(n).len() == 1 && !self.outputs.contains(&n));
        producer_ok && permutes_only && linear
    }

    /// How the value of `view` reaches its readers.
    fn view_plan(&self, view: NodeId) -> ViewPlan {
        let (source, chain) = self.view_chain(view);
        if chain.iter().all(|&v| matches!(self.graph.node(v).op, Op::Reshape { .. })) {
            return ViewPlan::Free;
        }
        let gemm_reader = self.graph.users_of(view).into_iter().any(|u| self.roles[&u] == Role::Gemm);
        // A convolution runs on cuDNN where it can, which reads memory in its own layout;
        // a depthwise one is the generated loop, which reads its filters through views.
        let conv_reader = self.graph.users_of(view).into_iter().any(|u| {
            self.roles[&u] == Role::Conv
                && !(self.graph.inputs_of(u)[1] == view && self.graph.is_depthwise_conv(u))
        });
        let needs_layout =
            self.outputs.contains(&view) || conv_reader || (gemm_reader && !self.gemm_reads_through(&chain));
        if !needs_layout {
            ViewPlan::Free
        } else if self.producer_stores_through(source, &chain) {
            ViewPlan::StoreThrough(source)
        } else {
            ViewPlan::Copy
        }
    }
}

/// How a layout op's value reaches its readers.
enum ViewPlan {
    /// Readers index through it.
    Free,
    /// A copy kernel writes it out.
    Copy,
    /// The kernel computing this value (the chain's source) writes it in the view's layout.
    StoreThrough(NodeId),
}

/// Partitions `graph` into kernels; `covers` names the ONNX nodes each node computes (nodes
/// missing from it cover their own origin).
pub fn partition(
    graph: &Graph,
    covers: &HashMap<NodeId, Vec<String>>,
    mode: Mode,
) -> Result<Partition, crate::ir::IrError> {
    let order = graph.topo_order()?;
    let position = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let roles: HashMap<NodeId, Role> = order.iter().map(|&n| (n, role(graph, n))).collect();
    let outputs: HashSet<NodeId> = graph.outputs().iter().map(|(_, id)| *id).collect();
    let mut b = Builder {
        graph,
        order,
        position,
        roles,
        kernel_of: HashMap::new(),
        kinds: Vec::new(),
        outputs,
        store_views: Vec::new(),
    };
    let order = b.order.clone();
    let op_name = |id: NodeId| graph.node(id).op.kind();
    if mode == Mode::OneKernelPerNode {
        for &id in &order {
            let kind = match b.roles[&id] {
                Role::None => continue,
                Role::View if matches!(graph.node(id).op, Op::Reshape { .. }) => continue,
                Role::View => KernelKind::Copy,
                Role::Gemm => KernelKind::Gemm { epilogue: vec![] },
                Role::Attention => KernelKind::Attention,
                Role::Row => KernelKind::RowReduction { op: op_name(id) },
                Role::Pointwise => KernelKind::Pointwise,
                Role::Gather => KernelKind::Gather,
                Role::Conv => KernelKind::Conv,
                Role::Single => KernelKind::Single { op: op_name(id) },
            };
            b.new_kernel(kind, id);
        }
    } else {
        for &id in &order {
            if b.roles[&id] == Role::Gemm {
                let k = b.new_kernel(KernelKind::Gemm { epilogue: vec![] }, id);
                let epilogue = b.gemm_epilogue(id, k);
                b.kinds[k] = KernelKind::Gemm { epilogue };
            }
        }
        for &id in &order {
            match b.roles[&id] {
                Role::Attention => {
                    let k = b.new_kernel(KernelKind::Attention, id);
                    b.mask_prologue(id, k);
                }
                Role::Row => {
                    let k = b.new_kernel(KernelKind::RowReduction { op: op_name(id) }, id);
                    b.row_prologue(id, k);
                    b.row_epilogue(id, k);
                }
                _ => {}
            }
        }
        for &id in &order {
            match b.roles[&id] {
                Role::Pointwise if !b.kernel_of.contains_key(&id) => b.pointwise_group(id),
                Role::Gather => {
                    b.new_kernel(KernelKind::Gather, id);
                }
                Role::Conv => {
                    b.new_kernel(KernelKind::Conv, id);
                }
                Role::Single => {
                    b.new_kernel(KernelKind::Single { op: op_name(id) }, id);
                }
                _ => {}
            }
        }
        b.merge_sibling_appends();
        b.appends_into_decoding_attention();
        for &id in &order {
            if b.roles[&id] != Role::View {
                continue;
            }
            match b.view_plan(id) {
                ViewPlan::Free => {}
                ViewPlan::Copy => {
                    b.new_kernel(KernelKind::Copy, id);
                }
                ViewPlan::StoreThrough(source) => b.store_views.push((source, id)),
            }
        }
    }
    Ok(assemble(b, covers))
}

fn assemble(b: Builder<'_>, covers: &HashMap<NodeId, Vec<String>>) -> Partition {
    let graph = b.graph;
    let mut kernels: Vec<Kernel> = b
        .kinds
        .iter()
        .map(|kind| Kernel {
            kind: kind.clone(),
            nodes: vec![],
            outputs: vec![],
            covers: vec![],
            store_views: vec![],
        })
        .collect();
    let mut views = Vec::new();
    let covered = |id: NodeId| -> Vec<String> {
        covers
            .get(&id)
            .filter(|c| !c.is_empty())
            .cloned()
            .unwrap_or_else(|| graph.node(id).origin.onnx_nodes().map(String::from).collect())
    };
    for &id in &b.order {
        match b.kernel_of.get(&id) {
            Some(&k) => {
                kernels[k].nodes.push(id);
                kernels[k].covers.extend(covered(id));
                // An attention kernel's mask prologue reads its values through views.
                let through_views = b.kinds[k] == KernelKind::Attention;
                let read_elsewhere =
                    readers(&b, id, through_views).iter().any(|u| b.kernel_of.get(u) != Some(&k));
                if read_elsewhere || b.outputs.contains(&id) {
                    kernels[k].outputs.push(id);
                }
            }
            None if b.roles[&id] == Role::View => views.push(id),
            None => {}
        }
    }
    for &(value, view) in &b.store_views {
        if let Some(&k) = b.kernel_of.get(&value) {
            kernels[k].store_views.push((value, view));
        }
    }
    // Views cost nothing; the ONNX nodes they stand for are credited to their first reader.
    for &v in &views {
        let mut stack = graph.users_of(v);
        let mut seen = HashSet::new();
        while let Some(u) = stack.pop() {
            if !seen.insert(u) {
                continue;
            }
            match b.kernel_of.get(&u) {
                Some(&k) => {
                    kernels[k].covers.extend(covered(v));
                    break;
                }
                None => stack.extend(graph.users_of(u)),
            }
        }
    }
    for k in &mut kernels {
        k.covers.sort_unstable();
        k.covers.dedup();
    }
    let order = kernel_order(&b, &kernels);
    // Kernels merged into others are left empty.
    let kernels =
        order.into_iter().filter(|&k| !kernels[k].nodes.is_empty()).map(|k| kernels[k].clone()).collect();
    Partition { kernels, views, graph_breaks: 0 }
}

/// The nodes that read `id`; with `through_views`, those that read it through views that
/// no kernel computes, in place of those views.
fn readers(b: &Builder<'_>, id: NodeId, through_views: bool) -> Vec<NodeId> {
    let mut found = Vec::new();
    let mut stack = b.graph.users_of(id);
    while let Some(u) = stack.pop() {
        let free_view = b.roles[&u] == Role::View && !b.kernel_of.contains_key(&u);
        if through_views && free_view && !b.outputs.contains(&u) {
            stack.extend(b.graph.users_of(u));
        } else {
            found.push(u);
        }
    }
    found
}

/// The kernel that computes `id`'s value, looking through views.
fn producer_kernel(b: &Builder<'_>, mut id: NodeId) -> Option<usize> {
    loop {
        if let Some(&k) = b.kernel_of.get(&id) {
            return Some(k);
        }
        if b.roles[&id] != Role::View {
            return None;
        }
        id = b.graph.inputs_of(id)[0];
    }
}

/// Kernels in dependency order (Kahn's algorithm; ties go to the kernel whose first node
/// comes first, so the order is deterministic).
fn kernel_order(b: &Builder<'_>, kernels: &[Kernel]) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = kernels.len();
    let mut deps: Vec<HashSet<usize>> = vec![HashSet::new(); n];
    for (k, kernel) in kernels.iter().enumerate() {
        for &node in &kernel.nodes {
            for input in b.graph.inputs_of(node) {
                if let Some(p) = producer_kernel(b, input).filter(|&p| p != k) {
                    deps[k].insert(p);
                }
            }
        }
    }
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (k, d) in deps.iter().enumerate() {
        for &p in d {
            readers[p].push(k);
        }
    }
    let first = |k: usize| kernels[k].nodes.iter().map(|id| b.position[id]).min().unwrap_or(0);
    let mut waiting: Vec<usize> = deps.iter().map(HashSet::len).collect();
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
        (0..n).filter(|&k| waiting[k] == 0).map(|k| Reverse((first(k), k))).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse((_, k))) = ready.pop() {
        order.push(k);
        for &r in &readers[k] {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.push(Reverse((first(r), r)));
            }
        }
    }
    debug_assert_eq!(order.len(), n, "the partition's kernels form a cycle");
    order
}

/// Whether `id` is a constant, or a broadcast or reshape of one, whose elements are all alike.
fn uniform_constant(graph: &Graph, id: NodeId) -> bool {
    graph.constant(graph.behind_views(id)).is_some_and(|value| {
        let values = value.to_f64_vec();
        values.first().is_some_and(|first| values.iter().all(|v| v.to_bits() == first.to_bits()))
    })
}

/// Whether `id` is a norm with no scale of its own: an RMSNorm (of x, or of its deviations)
/// whose scale `passes::FoldNormScales` folded into the products that read it.
/// `FUSEC_FOLDED_RESIDUAL=0` (at compile time) leaves the residual add in such a norm's kernel,
/// for measuring.
fn folded_norm(graph: &Graph, id: NodeId) -> bool {
    matches!(graph.node(id).op, Op::RmsNorm { .. })
        && graph.inputs_of(id).len() == 1
        && !crate::knobs::off("FUSEC_FOLDED_RESIDUAL")
}
