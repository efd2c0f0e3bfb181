//! Lowers a graph's f32 computation to f16 or bf16. Run after fusion, so that rules compare
//! the model's own f32 constants. Kernels accumulate reductions in f32 whatever the storage
//! type. Two policies:
//!
//! - **f16: everything in f16.** Weights are stored in f16, every f32 value becomes f16, and
//!   the graph keeps f32 at its boundary (a cast after each f32 input, one before each f32
//!   output).
//! - **bf16: mixed, as `torch.autocast` does it.** GEMMs, attention and convolutions read bf16
//!   operands (their weights stored in bf16) and write bf16, a bias added to a GEMM's product
//!   included; every other op computes in the type of its inputs (f32 constants, such as
//!   embeddings and LayerNorm's scale, count as f32), and in f32 when they mix. The residual
//!   stream of a transformer — embeddings, residual adds, LayerNorm/RMSNorm — so stays f32,
//!   while the tensor cores see bf16. bf16 keeps 8 significant bits: with every value rounded
//!   to it, a 12-layer BERT fixture ends 1.1e-2 (rel-L2) from f32; mixed, 4e-4.
//!
//! Casts between the two land next to the op that needs them, where fusion puts them in the
//! producer's or consumer's kernel.
//!
//! Under both, the angles of sines and cosines (a rotary embedding's positions times its
//! frequencies) are computed in f32, as PyTorch computes them (`angles`); the sines and
//! cosines are rounded to the target where the rest reads them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::SharedConstants;
use crate::ir::{DType, Graph, IrError, NodeId, Op, Origin, Tensor, UnaryOp};

/// The graph in `target` precision, and where each old node went.
///
/// The graph is consumed so that a model's weights are not held in both precisions at once:
/// in f16 every f32 constant is converted up front and let go as it is; in bf16 each
/// constant is let go once the last of its readers is lowered.
pub fn lower_precision(graph: Graph, target: DType) -> Result<(Graph, HashMap<NodeId, NodeId>), IrError> {
    lower_precision_sharing(graph, target, None)
}

/// [`lower_precision`], constants converted through `shared` where given.
pub fn lower_precision_sharing(
    graph: Graph,
    target: DType,
    shared: Option<&SharedConstants>,
) -> Result<(Graph, HashMap<NodeId, NodeId>), IrError> {
    lower_precision_halved(graph, target, shared, None)
}

/// The f32 constants of `graphs` taken out and converted to `target` on a few cores, per graph
/// its nodes' converted values: a value several graphs hold (the planner for ranges plans one
/// model at several sizes) is converted once, and let go as soon as it is — so the model's
/// weights are never all held in both types. Through `shared` where given.
pub fn halve_constants(
    graphs: &mut [&mut Graph],
    target: DType,
    shared: Option<&SharedConstants>,
) -> Vec<HashMap<NodeId, Arc<Tensor>>> {
    // Constants only angles read stay f32 (`angles`).
    let kept: Vec<HashSet<NodeId>> = graphs.iter().map(|g| super::angles::kept_in_f32(g)).collect();
    halve_keeping(graphs, &kept, target, shared)
}

/// [`halve_constants`], the nodes kept in f32 given for each graph.
fn halve_keeping(
    graphs: &mut [&mut Graph],
    kept: &[HashSet<NodeId>],
    target: DType,
    shared: Option<&SharedConstants>,
) -> Vec<HashMap<NodeId, Arc<Tensor>>> {
    // Each value once, with every (graph, node) holding it.
    let mut holders: HashMap<usize, Holders> = HashMap::new();
    for ((g, graph), kept) in graphs.iter_mut().enumerate().zip(kept) {
        let ids: Vec<NodeId> = graph
            .node_ids()
            .filter(|&id| graph.node(id).ty.dtype == DType::F32 && !kept.contains(&id))
            .collect();
        for id in ids {
            if let Some(value) = graph.take_constant(id) {
                holders
                    .entry(Arc::as_ptr(&value) as usize)
                    .or_insert_with(|| (value, Vec::new()))
                    .1
                    .push((g, id));
            }
        }
    }
    let converted = crate::parallel::map_owned_on(
        crate::parallel::CONVERSIONS,
        holders.into_values().collect(),
        |(value, at)| (SharedConstants::cast_through(shared, &value, target), at),
    );
    let mut halved = vec![HashMap::new(); graphs.len()];
    for (half, at) in converted {
        for (g, id) in at {
            halved[g].insert(id, half.clone());
        }
    }
    halved
}

/// A value and the (graph, node) pairs holding it.
type Holders = (Arc<Tensor>, Vec<(usize, NodeId)>);

/// [`lower_precision_sharing`] where the f16 policy's constants were already taken out and
/// converted ([`halve_constants`]): `halved`, given, is this graph's.
pub fn lower_precision_halved(
    mut graph: Graph,
    target: DType,
    shared: Option<&SharedConstants>,
    halved: Option<HashMap<NodeId, Arc<Tensor>>>,
) -> Result<(Graph, HashMap<NodeId, NodeId>), IrError> {
    let mixed = target == DType::BF16;
    // The f16 policy's angles and what only they read, kept in f32 (`angles`).
    let kept = if mixed { Default::default() } else { super::angles::kept_in_f32(&graph) };
    // Readers (one per use) still to lower, per constant; graph outputs hold theirs to the end.
    let mut readers: HashMap<NodeId, usize> = HashMap::new();
    for id in graph.node_ids() {
        for input in graph.inputs_of(id) {
            if graph.constant(input).is_some() {
                *readers.entry(input).or_insert(0) += 1;
            }
        }
    }
    for (_, id) in graph.outputs() {
        *readers.entry(*id).or_insert(0) += 1;
    }
    // Everything in the target type (f16): every f32 constant is only ever wanted rounded,
    // so all are converted up front, each f32 value let go once converted.
    let mut halved = match (mixed, halved) {
        (true, _) => HashMap::new(),
        (false, Some(halved)) => halved,
        (false, None) => halve_keeping(&mut [&mut graph], std::slice::from_ref(&kept), target, shared)
            .pop()
            .unwrap_or_default(),
    };
    let mut b = Lowering { out: Graph::new(), constants: HashMap::new(), converted: HashMap::new(), shared };
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for &input in graph.inputs() {
        let node = graph.node(input);
        let id = b.out.add_input(&node.name, node.ty.clone());
        let id = if node.ty.dtype == DType::F32 && !mixed { b.convert(id, target)? } else { id };
        map.insert(input, id);
    }
    for id in graph.topo_order()? {
        if map.contains_key(&id) {
            continue;
        }
        let node = graph.node(id);
        let new = match &node.op {
            Op::Constant(value) => match halved.remove(&id) {
                // Converted up front: the f32 value is gone.
                Some(half) => {
                    let new = b.out.add_constant(&node.name, half.clone(), node.origin.clone());
                    b.constants.insert(new, half);
                    new
                }
                None => {
                    let half = value.dtype() == DType::F32 && !mixed && !kept.contains(&id);
                    let stored = if half { target } else { value.dtype() };
                    b.constant(&node.name, value, stored, node.origin.clone())
                }
            },
            op => {
                let inputs: Vec<NodeId> = graph.inputs_of(id).iter().map(|i| map[i]).collect();
                let (op, want) = if mixed {
                    let cache = matches!(op, Op::Concat { .. }) && read_by_products_only(&graph, id);
                    b.mixed(op, &inputs, target, cache)
                } else if kept.contains(&id) {
                    (op.clone(), Some(DType::F32))
                } else {
                    // A kept value read by the rest in the target type.
                    let from_kept = graph.inputs_of(id).iter().any(|i| kept.contains(i));
                    (pure(op, target).0, from_kept.then_some(target))
                };
                let inputs = match want {
                    Some(want) => inputs
                        .into_iter()
                        .map(|i| if b.is_float(i) { b.convert(i, want) } else { Ok(i) })
                        .collect::<Result<_, _>>()?,
                    None => inputs,
                };
                let angle = matches!(op, Op::Unary(UnaryOp::Sin | UnaryOp::Cos));
                let new = b.out.add_op(op, &inputs, &node.name, node.origin.clone())?;
                // The bf16 policy's sines and cosines of f32 angles, rounded to the target as
                // PyTorch's rotary embeddings round them for the queries and keys they turn
                // (else those, and a decoder's cache, would widen to f32).
                if mixed && angle && b.out.node(new).ty.dtype == DType::F32 {
                    b.convert(new, target)?
                } else {
                    new
                }
            }
        };
        map.insert(id, new);
        for input in graph.inputs_of(id) {
            if let Some(left) = readers.get_mut(&input) {
                *left -= 1;
                if *left == 0 {
                    b.constants.remove(&map[&input]);
                    graph.take_constant(input);
                }
            }
        }
    }
    let mut outputs = Vec::new();
    for (name, id) in graph.outputs() {
        let new = map[id];
        let new = if graph.node(*id).ty.dtype != b.out.node(new).ty.dtype {
            let origin = Origin::new(name, "Cast");
            let to = graph.node(*id).ty.dtype;
            b.out.add_op(Op::Cast { to }, &[new], &format!("{name}_{to}"), origin)?
        } else {
            new
        };
        outputs.push((name.clone(), new));
    }
    b.out.set_outputs(outputs);
    // Constants whose every reader wanted them in another type.
    b.out.remove_unused();
    let out = b.out;
    map.retain(|_, new| out.contains(*new));
    crate::ir::verify(&out)?;
    Ok((out, map))
}

/// The f16 policy: `op` as it is (a cast to f32 now casts to the target), its float inputs
/// as they come (already in the target type).
fn pure(op: &Op, target: DType) -> (Op, Option<DType>) {
    match op {
        Op::Cast { to: DType::F32 } => (Op::Cast { to: target }, None),
        other => (other.clone(), None),
    }
}

struct Lowering<'s> {
    shared: Option<&'s SharedConstants>,
    out: Graph,
    /// Each constant of the new graph, with its value before rounding.
    constants: HashMap<NodeId, Arc<Tensor>>,
    /// Values already converted to another type: (value, type) → converted value.
    converted: HashMap<(NodeId, DType), NodeId>,
}

impl Lowering<'_> {
    fn constant(&mut self, name: &str, value: &Arc<Tensor>, dtype: DType, origin: Origin) -> NodeId {
        let stored = match value.dtype() == dtype {
            true => value.clone(),
            false => SharedConstants::cast_through(self.shared, value, dtype),
        };
        let id = self.out.add_constant(name, stored, origin);
        self.constants.insert(id, value.clone());
        id
    }

    fn is_float(&self, id: NodeId) -> bool {
        self.out.node(id).ty.dtype.is_float()
    }

    /// `id` in `dtype`: itself, a constant stored in that type (from the unrounded value), or
    /// a cast, each made once.
    fn convert(&mut self, id: NodeId, dtype: DType) -> Result<NodeId, IrError> {
        if self.out.node(id).ty.dtype == dtype {
            return Ok(id);
        }
        if let Some(&done) = self.converted.get(&(id, dtype)) {
            return Ok(done);
        }
        let node = self.out.node(id);
        let (name, origin) = (format!("{}_{dtype}", node.name), node.origin.clone());
        let new = match self.constants.get(&id).cloned() {
            Some(value) => self.constant(&name, &value, dtype, origin),
            None => self.out.add_op(Op::Cast { to: dtype }, &[id], &name, Origin::new(&node.name, "Cast"))?,
        };
        self.converted.insert((id, dtype), new);
        Ok(new)
    }

    /// Whether `inputs` (of a concatenation) are an f32 graph input followed by values of
    /// `target` only.
    fn extends_an_input(&self, inputs: &[NodeId], target: DType) -> bool {
        let node = |i: NodeId| self.out.node(i);
        inputs.len() >= 2
            && matches!(node(inputs[0]).op, Op::Input { .. })
            && node(inputs[0]).ty.dtype == DType::F32
            && inputs[1..].iter().all(|&i| node(i).ty.dtype == target)
    }

    /// The bf16 policy: GEMM-like ops read `target`; any other op reads its float inputs in
    /// their common type (f32 when they differ) — constants count with their own type, but
    /// a bias vector added to a GEMM's product follows the product, as inside a Linear.
    /// `cache`: a concatenation read only by products (through views) or as a graph output
    /// ([`read_by_products_only`]).
    fn mixed(&self, op: &Op, inputs: &[NodeId], target: DType, cache: bool) -> (Op, Option<DType>) {
        match op {
            op if takes_half_operands(op) => (op.clone(), Some(target)),
            Op::Cast { .. } => (op.clone(), None),
            // A decoder's cache: `present = Concat(past, new)`, `past` an f32 graph input and
            // `new` a projection's product (bf16), read only by attention (or products) and as
            // an output, is kept in bf16, as attention takes its operands; so the cache
            // updated in place is stored in bf16 (half the bytes a step reads) rather than
            // widened to f32. Where anything else reads it, it widens as other ops do.
            Op::Concat { .. } if cache && self.extends_an_input(inputs, target) => (op.clone(), Some(target)),
            _ => {
                let bias_of_gemm = matches!(op, Op::Binary(crate::ir::BinaryOp::Add))
                    && inputs.iter().any(|&i| takes_half_operands(&self.out.node(i).op))
                    && inputs.iter().any(|&i| {
                        let shape = &self.out.node(i).ty.shape;
                        self.constants.contains_key(&i) && shape.iter().rev().skip(1).all(|&d| d == 1)
                    });
                let mut values = inputs
                    .iter()
                    .filter(|&&i| self.is_float(i) && !(bias_of_gemm && self.constants.contains_key(&i)))
                    .map(|&i| self.out.node(i).ty.dtype);
                let want = match values.next() {
                    None => None,
                    Some(first) if values.all(|d| d == first) => Some(first),
                    Some(_) => Some(DType::F32),
                };
                (op.clone(), want)
            }
        }
    }
}

/// The ops the bf16 policy runs on `target` operands: matrix products, attention and
/// convolutions.
fn takes_half_operands(op: &Op) -> bool {
    matches!(op, Op::MatMul | Op::Gemm { .. } | Op::Attention { .. } | Op::Conv { .. })
}

/// Whether every reader of `id`, through views, is a product that takes its operands in the
/// half type ([`takes_half_operands`]); a graph output may be one too.
fn read_by_products_only(graph: &Graph, id: NodeId) -> bool {
    let mut stack = vec![id];
    while let Some(n) = stack.pop() {
        for user in graph.users_of(n) {
            match &graph.node(user).op {
                op if op.is_view() => stack.push(user),
                op if takes_half_operands(op) => {}
                _ => return false,
            }
        }
    }
    true
}
