//! The IR graph: one petgraph node per op, edges from producer to consumer weighted by the
//! consumer's input slot.

use std::collections::BTreeMap;
use std::sync::Arc;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use super::dtype::TensorType;
use super::error::IrError;
use super::op::Op;
use super::ops;
use super::tensor::Tensor;

/// A node of a [`Graph`] (stable while other nodes are removed).
pub type NodeId = NodeIndex;

/// Where a node came from: the ONNX node (name and `op_type`) it was translated from, and
/// the names of further ONNX nodes a pass merged into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The ONNX node's name.
    pub node: String,
    /// Its op_type.
    pub op_type: String,
    /// ONNX nodes merged into this one.
    pub merged: Vec<String>,
}

impl Origin {
    /// From ONNX node `node` of `op_type`.
    pub fn new(node: impl Into<String>, op_type: impl Into<String>) -> Self {
        Origin { node: node.into(), op_type: op_type.into(), merged: Vec::new() }
    }

    /// The ONNX node names this node stands for.
    pub fn onnx_nodes(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.node.as_str()).chain(self.merged.iter().map(String::as_str))
    }

    /// Makes this node stand for `names` as well (each once): a pass that removes nodes
    /// keeps their ONNX names on the node that now computes their value.
    pub fn absorb(&mut self, names: impl IntoIterator<Item = String>) {
        for name in names {
            if !self.onnx_nodes().any(|n| n == name) {
                self.merged.push(name);
            }
        }
    }
}

/// One node: an op and the type of its output.
#[derive(Clone, Debug)]
pub struct Node {
    /// What it computes.
    pub op: Op,
    /// The static type of the node's one output.
    pub ty: TensorType,
    /// The value's name (the ONNX tensor name it stands for).
    pub name: String,
    /// The ONNX node(s) it stands for.
    pub origin: Origin,
}

/// The IR graph: nodes over petgraph, edges in input order, with the graph's inputs and
/// named outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: StableDiGraph<Node, usize>,
    inputs: Vec<NodeId>,
    outputs: Vec<(String, NodeId)>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new graph input.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> NodeId {
        let op = Op::Input { name: name.to_string() };
        let origin = Origin::new(name, "Input");
        let id = self.g.add_node(Node { op, ty, name: name.to_string(), origin });
        self.inputs.push(id);
        id
    }

    /// A new constant.
    pub fn add_constant(&mut self, name: &str, value: Arc<Tensor>, origin: Origin) -> NodeId {
        let ty = value.tensor_type();
        self.g.add_node(Node { op: Op::Constant(value), ty, name: name.to_string(), origin })
    }

    /// Adds `op` applied to `inputs`, inferring its type; a type error names the node.
    pub fn add_op(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        name: &str,
        origin: Origin,
    ) -> Result<NodeId, IrError> {
        let ty = self.infer(&op, inputs).map_err(|message| IrError::Op {
            node: origin.node.clone(),
            op: op.kind(),
            message,
        })?;
        let id = self.g.add_node(Node { op, ty, name: name.to_string(), origin });
        for (slot, &input) in inputs.iter().enumerate() {
            self.g.add_edge(input, id, slot);
        }
        Ok(id)
    }

    /// The type `op` would have on `inputs`.
    pub fn infer(&self, op: &Op, inputs: &[NodeId]) -> Result<TensorType, String> {
        let types: Vec<&TensorType> = inputs.iter().map(|&i| &self.g[i].ty).collect();
        ops::infer(op, &types)
    }

    /// Sets the graph's outputs, by name.
    pub fn set_outputs(&mut self, outputs: Vec<(String, NodeId)>) {
        self.outputs = outputs;
    }

    /// The graph's inputs, in order.
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// The graph's outputs and their names, in order.
    pub fn outputs(&self) -> &[(String, NodeId)] {
        &self.outputs
    }

    /// The node `id` (which must be in the graph).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    /// The node `id`, to change (it must be in the graph).
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.g[id]
    }

    /// Whether `id` is in the graph.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id)
    }

    /// How many nodes there are.
    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    /// Every node's id.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices()
    }

    /// The producers of `id`'s inputs, in input-slot order.
    pub fn inputs_of(&self, id: NodeId) -> Vec<NodeId> {
        let mut edges: Vec<(usize, NodeId)> =
            self.g.edges_directed(id, Direction::Incoming).map(|e| (*e.weight(), e.source())).collect();
        edges.sort_unstable();
        edges.into_iter().map(|(_, src)| src).collect()
    }

    /// The input slots of `id` in order (to check that they are 0..n).
    pub(crate) fn input_slots(&self, id: NodeId) -> Vec<usize> {
        let mut slots: Vec<usize> =
            self.g.edges_directed(id, Direction::Incoming).map(|e| *e.weight()).collect();
        slots.sort_unstable();
        slots
    }

    /// The distinct nodes that read `id`.
    pub fn users_of(&self, id: NodeId) -> Vec<NodeId> {
        let mut users: Vec<NodeId> = self.g.neighbors_directed(id, Direction::Outgoing).collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    /// Whether `id` is a depthwise convolution: several groups of one input channel each.
    pub fn is_depthwise_conv(&self, id: NodeId) -> bool {
        let Op::Conv { group, channels_last, .. } = self.node(id).op else { return false };
        let filters = &self.node(self.inputs_of(id)[1]).ty.shape;
        let per_group = if channels_last { filters.get(3) } else { filters.get(1) };
        group > 1 && per_group == Some(&1)
    }

    /// The node `id` views: `id` itself, or what a chain of broadcasts and reshapes (`Expand`,
    /// `Reshape`) starting at `id` reads.
    pub fn behind_views(&self, mut id: NodeId) -> NodeId {
        while matches!(self.node(id).op, Op::Expand { .. } | Op::Reshape { .. }) {
            id = self.inputs_of(id)[0];
        }
        id
    }

    /// The constant value of `id`, if it is a `Constant` node.
    pub fn constant(&self, id: NodeId) -> Option<&Arc<Tensor>> {
        match &self.g[id].op {
            Op::Constant(t) => Some(t),
            _ => None,
        }
    }

    /// Takes the value out of constant `id`, for a stage done with it (its bytes moved or
    /// converted elsewhere): the node keeps its type, an empty tensor of its element type
    /// stands in for the value. `None` when `id` is not a constant.
    pub fn take_constant(&mut self, id: NodeId) -> Option<Arc<Tensor>> {
        let dtype = self.g[id].ty.dtype;
        match &mut self.g[id].op {
            Op::Constant(value) => {
                let empty = Arc::new(Tensor::full(&crate::ir::TensorType::new(dtype, vec![0]), 0.0));
                Some(std::mem::replace(value, empty))
            }
            _ => None,
        }
    }

    /// Makes every reader of `old` (and every graph output naming it) read `new` instead.
    pub fn replace_uses(&mut self, old: NodeId, new: NodeId) {
        let edges: Vec<_> = self
            .g
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (edge, target, slot) in edges {
            self.g.remove_edge(edge);
            self.g.add_edge(new, target, slot);
        }
        for (_, out) in &mut self.outputs {
            if *out == old {
                *out = new;
            }
        }
    }

    /// Makes input `slot` of `consumer` read `new`.
    pub fn set_input(&mut self, consumer: NodeId, slot: usize, new: NodeId) {
        let old: Vec<_> = self
            .g
            .edges_directed(consumer, Direction::Incoming)
            .filter(|e| *e.weight() == slot)
            .map(|e| e.id())
            .collect();
        for edge in old {
            self.g.remove_edge(edge);
        }
        self.g.add_edge(new, consumer, slot);
    }

    /// Drops the inputs of `id` from slot `slots` on (its first `slots` stay).
    pub fn keep_inputs(&mut self, id: NodeId, slots: usize) {
        let dropped: Vec<_> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .filter(|e| *e.weight() >= slots)
            .map(|e| e.id())
            .collect();
        for edge in dropped {
            self.g.remove_edge(edge);
        }
    }

    /// Removes `id` and its edges. Callers make sure nothing reads it any more.
    pub fn remove_node(&mut self, id: NodeId) -> Option<Node> {
        self.inputs.retain(|&i| i != id);
        self.g.remove_node(id)
    }

    /// Removes every node that no graph output depends on (graph inputs stay); returns how
    /// many were removed.
    pub fn remove_unused(&mut self) -> usize {
        let mut live = std::collections::HashSet::new();
        let mut stack: Vec<NodeId> = self.outputs.iter().map(|(_, id)| *id).collect();
        stack.extend(self.inputs.iter().copied());
        while let Some(id) = stack.pop() {
            if live.insert(id) {
                stack.extend(self.g.neighbors_directed(id, Direction::Incoming));
            }
        }
        let dead: Vec<NodeId> = self.g.node_indices().filter(|id| !live.contains(id)).collect();
        for &id in &dead {
            self.g.remove_node(id);
        }
        dead.len()
    }

    /// Nodes ordered so that every producer precedes its readers. The order depends only on
    /// the graph's structure and insertion order, so it is the same on every run.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, IrError> {
        petgraph::algo::toposort(&self.g, None)
            .map_err(|cycle| IrError::Cycle { node: self.g[cycle.node_id()].origin.node.clone() })
    }

    /// How many nodes of each kind (`Add`, `MatMul`, …), inputs and constants left out.
    pub fn op_histogram(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for id in self.g.node_indices() {
            let op = &self.g[id].op;
            if !matches!(op, Op::Input { .. } | Op::Constant(_)) {
                *counts.entry(op.kind()).or_insert(0) += 1;
            }
        }
        counts
    }
}
