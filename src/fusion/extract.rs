//! E-graph → IR: the cheapest node of every needed class under the cost model, rebuilt as an
//! IR graph (shared classes stay shared). Each new node keeps the name and origin of an
//! original node of its class, and records which ONNX nodes it covers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use egg::{Extractor, Id};

use super::analysis::{ir_op, FusionGraph};
use super::cost::HbmCost;
use super::lang::FusionLang;
use super::FusionError;
use crate::ir::{Graph, NodeId, Op, Origin};

/// The extracted graph and, for each of its nodes, the ONNX nodes it computes.
pub struct Extracted {
    pub graph: Graph,
    pub covers: HashMap<NodeId, Vec<String>>,
    /// Whether each attention class took the kernel, in the order of the classes' ids.
    pub attention: Vec<bool>,
}

struct Builder<'a> {
    egraph: &'a FusionGraph,
    extractor: Extractor<'a, HbmCost<'a>, FusionLang, super::analysis::FusionAnalysis>,
    original_of: HashMap<Id, NodeId>,
    source: &'a Graph,
    graph: Graph,
    built: HashMap<Id, NodeId>,
}

impl Builder<'_> {
    fn name_and_origin(&self, class: Id) -> (String, Origin) {
        match self.original_of.get(&class) {
            Some(&orig) => {
                let node = self.source.node(orig);
                (node.name.clone(), node.origin.clone())
            }
            None => (format!("fused_{class}"), Origin::new(format!("fused_{class}"), "fusec")),
        }
    }

    /// The IR node of `class`, built after those of its inputs. Iterative (an explicit stack,
    /// not recursion), so that graphs thousands of nodes deep do not overflow the stack: a
    /// class is pushed with its op and inputs once they are known, above those inputs (first
    /// input on top, the order a recursion would build them in), and built when it is back on
    /// top.
    fn build(&mut self, class: Id) -> Result<NodeId, FusionError> {
        type Ready = Option<(FusionLang, Option<Op>, Vec<Id>)>;
        let mut stack: Vec<(Id, Ready)> = vec![(self.egraph.find(class), None)];
        while let Some((class, ready)) = stack.pop() {
            if self.built.contains_key(&class) {
                continue;
            }
            let Some((node, op, inputs)) = ready else {
                let node = self.extractor.find_best_node(class).clone();
                let (op, inputs) = match &node {
                    FusionLang::Const(_) => (None, Vec::new()),
                    _ => {
                        let (op, inputs) = ir_op(&node, &self.egraph.analysis, |i| &self.egraph[i].data)
                            .ok_or_else(|| {
                                FusionError::Extraction(format!(
                                    "class {class} extracted as {node}, which has no IR op"
                                ))
                            })?;
                        (Some(op), inputs.iter().map(|&i| self.egraph.find(i)).collect())
                    }
                };
                let missing: Vec<Id> =
                    inputs.iter().copied().filter(|i| !self.built.contains_key(i)).collect();
                stack.push((class, Some((node, op, inputs))));
                stack.extend(missing.into_iter().rev().map(|i| (i, None)));
                continue;
            };
            let (name, origin) = self.name_and_origin(class);
            let id = match (&node, op) {
                (FusionLang::Const(c), _) => {
                    let value = Arc::clone(self.egraph.analysis.constant(*c));
                    self.graph.add_constant(&name, value, origin)
                }
                (_, Some(op)) => {
                    let inputs: Vec<NodeId> = inputs.iter().map(|i| self.built[i]).collect();
                    self.graph.add_op(op, &inputs, &name, origin)?
                }
                (_, None) => return Err(FusionError::Extraction(format!("class {class} has no IR op"))),
            };
            self.built.insert(class, id);
        }
        Ok(self.built[&self.egraph.find(class)])
    }
}

pub fn extract(
    source: &Graph,
    class_of: &HashMap<NodeId, Id>,
    egraph: &FusionGraph,
    precision: crate::ir::DType,
    forced_attention: Option<&[bool]>,
) -> Result<Extracted, FusionError> {
    let order = source.topo_order()?;
    let mut original_of = HashMap::new();
    for &id in &order {
        original_of.entry(egraph.find(class_of[&id])).or_insert(id);
    }
    let cost = HbmCost::new(egraph, precision, forced_attention);
    let attention = cost.attention_in_order();
    let extractor = Extractor::new(egraph, cost);
    let mut builder =
        Builder { egraph, extractor, original_of, source, graph: Graph::new(), built: HashMap::new() };
    // Inputs first, in their original order.
    for &input in source.inputs() {
        let node = source.node(input);
        let id = builder.graph.add_input(&node.name, node.ty.clone());
        builder.built.insert(egraph.find(class_of[&input]), id);
    }
    let mut outputs = Vec::new();
    for (name, id) in source.outputs() {
        outputs.push((name.clone(), builder.build(class_of[id])?));
    }
    let built = builder.built;
    let mut graph = builder.graph;
    graph.set_outputs(outputs);
    let covers = coverage(source, &order, class_of, egraph, &built);
    crate::ir::verify(&graph)?;
    graph.remove_unused();
    Ok(Extracted { graph, covers, attention })
}

/// Which ONNX nodes each extracted node computes: an original node whose class was extracted
/// is covered by that class's node; one that vanished into a pattern is covered by the first
/// extracted nodes downstream of it.
fn coverage(
    source: &Graph,
    order: &[NodeId],
    class_of: &HashMap<NodeId, Id>,
    egraph: &FusionGraph,
    built: &HashMap<Id, NodeId>,
) -> HashMap<NodeId, Vec<String>> {
    let mut covers: HashMap<NodeId, Vec<String>> = HashMap::new();
    let extracted = |id: NodeId| built.get(&egraph.find(class_of[&id])).copied();
    for &id in order {
        let node = source.node(id);
        if matches!(node.op, Op::Input { .. } | Op::Constant(_)) {
            continue;
        }
        let mut owners = Vec::new();
        let mut stack = vec![id];
        let mut seen = HashSet::new();
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            match extracted(n) {
                Some(owner) => owners.push(owner),
                None => stack.extend(source.users_of(n)),
            }
        }
        owners.sort_unstable();
        owners.dedup();
        for owner in owners {
            covers.entry(owner).or_default().extend(node.origin.onnx_nodes().map(String::from));
        }
    }
    for names in covers.values_mut() {
        names.sort_unstable();
        names.dedup();
    }
    covers
}
