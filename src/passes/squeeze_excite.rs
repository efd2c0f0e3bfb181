//! Squeeze-and-excitation gates as one op: after `split-reductions`, a global pool's second
//! stage, the two small products with their biases and activations, and the gate's
//! activation — `mean → MatMul(w1) → +b1 → act → [Concat(zeros)] → MatMul(w2) → +b2 → gate` —
//! become one [`Op::ChannelGate`] reading the pool's first stage. Unfused, that chain is six to
//! eight launches on a few kilobytes (two GEMMs of one row per sample, their epilogues, a
//! zero-padding concat, the pool's last stage); as one op it is one kernel
//! (`codegen/gate.rs`).
//!
//! Where the 1×1 projection after the block reads the scaled activations alone, the gate is
//! folded into its weights (`[N, C, O]` per sample, [`Fold`]) and the projection becomes a
//! batch of products: the scaling is never written, and the block is two kernels (the pool's
//! first stage, the gate) besides its convolutions.
//!
//! The weights must be constants, the biases constants or broadcasts of one (a missing bias
//! is zeros), and every value inside the chain read only inside it. Activations recognised:
//! ReLU, SiLU (`x·σ(x)`), identity between the products; sigmoid and HardSigmoid
//! (`clip(α·x + β, 0, 1)`, or `clip(x, 0, 1)` where fusion folded α and β into the product)
//! for the gate.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::ir::ops::gate::MAX_WIDTH;
use crate::ir::{BinaryOp, GateActivation, Graph, IrError, NodeId, Op, ReduceOp, Tensor, UnaryOp};

/// Rewrites every squeeze-and-excitation chain of `graph` into a `ChannelGate`, the ONNX
/// names of the nodes it replaces kept on it (in `covers` too); returns how many.
pub fn squeeze_excite(
    graph: &mut Graph,
    covers: &mut HashMap<NodeId, Vec<String>>,
) -> Result<usize, IrError> {
    let outputs: HashSet<NodeId> = graph.outputs().iter().map(|(_, id)| *id).collect();
    let mut made = 0;
    for id in graph.topo_order()? {
        if !graph.contains(id) {
            continue;
        }
        let Some(chain) = Chain::find(graph, id, &outputs) else { continue };
        let end = graph.node(chain.end).clone();
        let add = |graph: &mut Graph, tensor: Arc<Tensor>, what: &str| {
            graph.add_constant(&format!("{}/{what}", end.name), tensor, end.origin.clone())
        };
        let b1 = add(graph, Arc::new(chain.b1.cast(end.ty.dtype)), "b1");
        let b2 = add(graph, Arc::new(chain.b2.cast(end.ty.dtype)), "b2");
        let w1 = add(graph, chain.w1.clone(), "w1");
        let w2 = add(graph, chain.w2.clone(), "w2");
        let op = Op::ChannelGate { hidden: chain.hidden, gate: chain.gate };
        let fold = Fold::find(graph, chain.end, &outputs);
        let mut inputs = vec![chain.x, w1, b1, w2, b2];
        let mut replaced = chain.nodes.clone();
        if let Some(fold) = &fold {
            inputs.push(fold.weights);
            replaced.extend([fold.scale, fold.product]);
        }
        let mut origin = end.origin.clone();
        let mut names: Vec<String> = covers.get(&chain.end).cloned().unwrap_or_default();
        for &n in &replaced {
            origin.absorb(graph.node(n).origin.onnx_nodes().map(str::to_string).collect::<Vec<_>>());
            names.extend(covers.get(&n).cloned().unwrap_or_default());
        }
        names.sort();
        names.dedup();
        let gate = graph.add_op(op, &inputs, &end.name, origin)?;
        match fold {
            None if graph.node(gate).ty != end.ty => {
                return Err(IrError::Op {
                    node: end.name.clone(),
                    op: "ChannelGate".into(),
                    message: format!("a channel gate of {} for {}", graph.node(gate).ty, end.ty),
                });
            }
            None => graph.replace_uses(chain.end, gate),
            Some(fold) => fold.apply(graph, gate, covers)?,
        }
        covers.insert(gate, names);
        graph.remove_unused();
        made += 1;
    }
    Ok(made)
}

/// The 1×1 projection that reads the gated activations, where the gate folds into its
/// weights: `MatMul(Mul(x, gate), wp)` with `wp [C, O]` constant, the scaled activations read
/// by it alone, and `O` at most the positions of a sample (the folded weights, `[N, C, O]`, no
/// larger than the scaled activations they spare).
struct Fold {
    /// The activations the gate scales, `[N, …, C]`.
    activations: NodeId,
    /// The scaling `Mul`.
    scale: NodeId,
    /// The projection `MatMul`.
    product: NodeId,
    /// Its weights.
    weights: NodeId,
}

impl Fold {
    fn find(graph: &Graph, gate: NodeId, outputs: &HashSet<NodeId>) -> Option<Fold> {
        let [scale] = graph.users_of(gate)[..] else { return None };
        let inputs = graph.inputs_of(scale);
        if graph.node(scale).op != Op::Binary(BinaryOp::Mul)
            || outputs.contains(&scale)
            || outputs.contains(&gate)
        {
            return None;
        }
        let activations = if inputs[0] == gate { inputs[1] } else { inputs[0] };
        let shape = graph.node(activations).ty.shape.clone();
        if graph.node(scale).ty.shape != shape || shape.len() < 3 || activations == gate {
            return None;
        }
        let [product] = graph.users_of(scale)[..] else { return None };
        let weights = graph.inputs_of(product).get(1).copied()?;
        let w = graph.constant(weights)?;
        let positions: usize = shape[1..shape.len() - 1].iter().product();
        let fits =
            w.shape().len() == 2 && w.shape()[0] == shape[shape.len() - 1] && w.shape()[1] <= positions;
        (graph.node(product).op == Op::MatMul && graph.inputs_of(product)[0] == scale && fits)
            .then_some(Fold { activations, scale, product, weights })
    }

    /// Replaces the projection by `x[n] · folded[n]` per sample, `folded` the gate with the
    /// weights folded in.
    fn apply(
        &self,
        graph: &mut Graph,
        folded: NodeId,
        covers: &mut HashMap<NodeId, Vec<String>>,
    ) -> Result<(), IrError> {
        let shape = graph.node(self.activations).ty.shape.clone();
        let (n, c) = (shape[0], shape[shape.len() - 1]);
        let positions: usize = shape[1..shape.len() - 1].iter().product();
        let product = graph.node(self.product).clone();
        let rows = Op::Reshape { shape: vec![n, positions, c] };
        let rows = graph.add_op(
            rows,
            &[self.activations],
            &format!("{}/rows", product.name),
            product.origin.clone(),
        )?;
        let batched = graph.add_op(Op::MatMul, &[rows, folded], &product.name, product.origin.clone())?;
        let back = Op::Reshape { shape: product.ty.shape.clone() };
        let back =
            graph.add_op(back, &[batched], &format!("{}/back", product.name), product.origin.clone())?;
        if let Some(names) = covers.get(&self.product).cloned() {
            covers.insert(batched, names);
        }
        graph.replace_uses(self.product, back);
        Ok(())
    }
}

/// The largest first product (channels × hidden units) made a gate. Each block of the gate's
/// kernel reads the first product's weights whole, once per sample and tile: on the H100,
/// MobileNetV3-Large's gates of 672 × 168 and 960 × 240 took 8–15 µs at batch 8, slower than
/// the cuBLAS products and small kernels they replaced; EfficientNet-B0's (up to 1152 × 48)
/// and MobileNetV3's smaller ones are faster as gates (`benches/NOTES.md`).
const MAX_PRODUCT: usize = 65_536;

/// One squeeze-and-excitation chain found in the graph.
struct Chain {
    /// The pool's first stage, which the gate reads.
    x: NodeId,
    w1: Arc<Tensor>,
    b1: Tensor,
    hidden: GateActivation,
    w2: Arc<Tensor>,
    b2: Tensor,
    gate: GateActivation,
    /// The gate's value, whose readers the op takes over.
    end: NodeId,
    /// Every node the op replaces.
    nodes: Vec<NodeId>,
}

impl Chain {
    /// The chain whose pool's second stage is `pool`, if it is one.
    fn find(graph: &Graph, pool: NodeId, outputs: &HashSet<NodeId>) -> Option<Chain> {
        let Op::Reduce { op: ReduceOp::Mean, axes, keep_dims: true } = &graph.node(pool).op else {
            return None;
        };
        let x = graph.inputs_of(pool)[0];
        let shape = &graph.node(x).ty.shape;
        let rank = shape.len();
        // The pool's last stage: over the one axis left of a [N, P, 1, …, C] first stage.
        if rank < 3 || axes.len() != 1 || axes[0] == 0 || axes[0] + 1 == rank {
            return None;
        }
        if shape.iter().enumerate().any(|(i, &d)| i != 0 && i + 1 != rank && i != axes[0] && d != 1) {
            return None;
        }
        let c = shape[rank - 1];
        if graph.node(x).op.is_view() {
            return None;
        }
        let mut nodes = vec![pool];
        let inner = |id: NodeId| !outputs.contains(&id);
        let only = |id: NodeId| -> Option<NodeId> {
            let users = graph.users_of(id);
            (users.len() == 1 && inner(id)).then(|| users[0])
        };
        // First product.
        let m1 = only(pool)?;
        let (w1, conv_b1) = product(graph, m1, pool, c)?;
        let h = w1.shape()[1];
        if c + h > MAX_WIDTH || c * h > MAX_PRODUCT {
            return None;
        }
        nodes.push(m1);
        let (b1, after_b1) = match conv_b1 {
            Some(b) => (b, m1),
            None => bias(graph, m1, h, &only, &mut nodes)?,
        };
        let (hidden, after_hidden) = hidden_activation(graph, after_b1, &only, &mut nodes)?;
        // An optional zero padding of the hidden width (a GEMM's alignment).
        let mut value = after_hidden;
        let mut next = only(value)?;
        if let Op::Concat { axis } = graph.node(next).op {
            let inputs = graph.inputs_of(next);
            if axis + 1 != rank
                || inputs.len() != 2
                || inputs[0] != value
                || super::noop::zero_views(graph, inputs[1]).is_none()
            {
                return None;
            }
            nodes.push(next);
            value = next;
            next = only(value)?;
        }
        let padded = *graph.node(value).ty.shape.last()?;
        let (w2, conv_b2) = product(graph, next, value, padded)?;
        if w2.shape()[1] != c {
            return None;
        }
        nodes.push(next);
        let (b2, after_b2) = match conv_b2 {
            Some(b) => (b, next),
            None => bias(graph, next, c, &only, &mut nodes)?,
        };
        let (gate, end) = gate_activation(graph, after_b2, &only, &mut nodes)?;
        nodes.retain(|&n| n != end);
        Some(Chain { x, w1, b1, hidden, w2, b2, gate, end, nodes })
    }
}

/// The product node `m` takes of `left` (`[…, k]`): its `[k, n]` weights, from a MatMul by a
/// constant or a 1×1 channels-last convolution (and then its bias, when it has one).
fn product(graph: &Graph, m: NodeId, left: NodeId, k: usize) -> Option<(Arc<Tensor>, Option<Tensor>)> {
    let inputs = graph.inputs_of(m);
    if inputs.len() < 2 || inputs[0] != left {
        return None;
    }
    let w = graph.constant(inputs[1])?;
    match graph.node(m).op {
        Op::MatMul => (w.shape().len() == 2 && w.shape()[0] == k).then(|| (w.clone(), None)),
        Op::Conv {
            strides: [1, 1],
            pads: [0, 0, 0, 0],
            dilations: [1, 1],
            group: 1,
            channels_last: true,
        } => {
            // Filters KRSC, [n, 1, 1, k]: transposed to [k, n].
            let &[n, 1, 1, kk] = w.shape() else { return None };
            if kk != k {
                return None;
            }
            let values = w.to_f64_vec();
            let t: Vec<f64> =
                (0..k).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| values[j * k + i]).collect();
            let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[k, n]), t).ok()?;
            let bias = match inputs.get(2) {
                Some(&b) => Some(vector(graph, b, n)?),
                None => None,
            };
            Some((Arc::new(Tensor::from_f64(array, w.dtype())), bias))
        }
        _ => None,
    }
}

/// The bias added to `value` (`[width]` as a vector) and the value after it; zeros where
/// no `Add` of a constant follows.
fn bias(
    graph: &Graph,
    value: NodeId,
    width: usize,
    only: &dyn Fn(NodeId) -> Option<NodeId>,
    nodes: &mut Vec<NodeId>,
) -> Option<(Tensor, NodeId)> {
    let dtype = graph.node(value).ty.dtype;
    let zeros = || Tensor::full(&crate::ir::TensorType::new(dtype, vec![width]), 0.0);
    let Some(next) = only(value) else { return Some((zeros(), value)) };
    if graph.node(next).op != Op::Binary(BinaryOp::Add) {
        return Some((zeros(), value));
    }
    let inputs = graph.inputs_of(next);
    let other = if inputs[0] == value { inputs[1] } else { inputs[0] };
    if graph.node(next).ty != graph.node(value).ty {
        return Some((zeros(), value));
    }
    match vector(graph, other, width) {
        Some(b) => {
            nodes.push(next);
            Some((b, next))
        }
        None => Some((zeros(), value)),
    }
}

/// Node `id` as a `[width]` vector: a constant of `width` elements (any leading ones), or a
/// broadcast of one element.
fn vector(graph: &Graph, id: NodeId, width: usize) -> Option<Tensor> {
    if let Some(t) = graph.constant(id) {
        let leading_ones = t.shape().iter().rev().skip(1).all(|&d| d == 1);
        if t.len() == width && t.shape().last() == Some(&width) && leading_ones {
            return t.reshaped(&[width]);
        }
    }
    let Op::Expand { .. } = graph.node(id).op else { return None };
    let source = graph.constant(graph.inputs_of(id)[0])?;
    let ty = &graph.node(id).ty;
    if source.len() != 1 || ty.shape.last() != Some(&width) || ty.len() != width {
        return None;
    }
    let value = source.to_f64_vec()[0];
    Some(Tensor::full(&crate::ir::TensorType::new(ty.dtype, vec![width]), value))
}

/// The activation between the products, read from `value`, and the value after it.
fn hidden_activation(
    graph: &Graph,
    value: NodeId,
    only: &dyn Fn(NodeId) -> Option<NodeId>,
    nodes: &mut Vec<NodeId>,
) -> Option<(GateActivation, NodeId)> {
    let users = graph.users_of(value);
    match users.as_slice() {
        [r] if graph.node(*r).op == Op::Unary(UnaryOp::Relu) => {
            nodes.push(*r);
            Some((GateActivation::Relu, *r))
        }
        [a, b] => {
            // SiLU: Sigmoid(v) read once, by Mul(v, σ) (either order).
            let (s, m) = if graph.node(*a).op == Op::Unary(UnaryOp::Sigmoid) { (*a, *b) } else { (*b, *a) };
            let mul_inputs = graph.inputs_of(m);
            let silu = graph.node(s).op == Op::Unary(UnaryOp::Sigmoid)
                && graph.node(m).op == Op::Binary(BinaryOp::Mul)
                && only(s) == Some(m)
                && mul_inputs.contains(&value)
                && mul_inputs.contains(&s)
                && graph.node(m).ty == graph.node(value).ty;
            silu.then(|| {
                nodes.extend([s, m]);
                (GateActivation::Silu, m)
            })
        }
        _ => Some((GateActivation::Identity, value)),
    }
}

/// The gate's activation, read from `value`, and the gate's value.
fn gate_activation(
    graph: &Graph,
    value: NodeId,
    only: &dyn Fn(NodeId) -> Option<NodeId>,
    nodes: &mut Vec<NodeId>,
) -> Option<(GateActivation, NodeId)> {
    let next = only(value)?;
    // Node `n`, `op` of `prev` and a one-element constant: that constant.
    let scalar = |n: NodeId, op: BinaryOp, prev: NodeId| -> Option<f32> {
        let inputs = graph.inputs_of(n);
        if graph.node(n).op != Op::Binary(op) || !inputs.contains(&prev) {
            return None;
        }
        let other = if inputs[0] == prev { inputs[1] } else { inputs[0] };
        let t = graph.constant(other)?;
        (t.len() == 1).then(|| t.to_f64_vec()[0] as f32)
    };
    match graph.node(next).op {
        Op::Unary(UnaryOp::Sigmoid) => {
            nodes.push(next);
            Some((GateActivation::Sigmoid, next))
        }
        // HardSigmoid with α and β folded into the product's weights and bias.
        Op::Clip { min, max } if min == 0.0 && max == 1.0 && graph.node(next).ty == graph.node(value).ty => {
            nodes.push(next);
            Some((GateActivation::HardSigmoid { alpha: 1.0, beta: 0.0 }, next))
        }
        Op::Binary(BinaryOp::Mul) => {
            // HardSigmoid: clip(x·α + β, 0, 1).
            let mul = next;
            let alpha = scalar(mul, BinaryOp::Mul, value)?;
            let add = only(mul)?;
            let beta = scalar(add, BinaryOp::Add, mul)?;
            let clip = only(add)?;
            let Op::Clip { min, max } = graph.node(clip).op else { return None };
            let shape_kept = [mul, add, clip].iter().all(|&n| graph.node(n).ty == graph.node(value).ty);
            (min == 0.0 && max == 1.0 && shape_kept).then(|| {
                nodes.extend([mul, add, clip]);
                (GateActivation::HardSigmoid { alpha, beta }, clip)
            })
        }
        _ => None,
    }
}
