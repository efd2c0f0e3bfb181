//! Channels-last layout for convolutions: each convolution cuDNN runs on tensor cores (the
//! same padding at both ends, constant filters) becomes an NHWC convolution between two
//! transposes, `T(conv_nhwc(T(x)))`, with its filters stored KRSC; one of a 1×1 window,
//! stride 1 and no padding becomes a GEMM over the channels instead. The transposes are then
//! moved past the pointwise ops after each convolution (a per-channel constant is permuted
//! with them), past pools and past reductions that keep their axes (a squeeze-and-excitation
//! gate's global pool), and a transpose that meets its inverse cancels: between two
//! convolutions of a network the activations stay NHWC, and only the graph's input and the
//! values other ops read are transposed, by the kernels that write or read them.

use std::sync::Arc;

use super::Pass;
use crate::ir::{ops, BinaryOp, DType, Graph, IrError, NodeId, Op, PoolWindow, Tensor};

/// NCHW to NHWC.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
/// NHWC to NCHW.
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];
/// How depthwise convolutions (one group per channel) run, at compile time:
/// `FUSEC_DEPTHWISE=tile` (the default: windows of 5×5 and more in the shared-memory tile
/// kernel, smaller ones in the generated loop), `loop` (the loop for every window) or `cudnn`.
/// The generated kernels, with their epilogue fused, measured faster than cuDNN on the H100
/// (MobileNetV3-Large fp16 b8 2.042 → 1.747 ms, `benches/NOTES.md`). The channels-last pass
/// reads it (only the generated kernels take asymmetric padding), and so does codegen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depthwise {
    /// Windows of 5×5 and more in the shared-memory tile kernel, smaller ones in the loop.
    Tile,
    /// The generated loop for every window.
    Loop,
    /// cuDNN (symmetric padding only).
    Cudnn,
}

impl Depthwise {
    /// The setting of `FUSEC_DEPTHWISE`: `Tile` unless it says `loop` or `cudnn`.
    pub fn from_env() -> Self {
        match std::env::var("FUSEC_DEPTHWISE").as_deref().map(str::trim) {
            Ok("loop") => Depthwise::Loop,
            Ok("cudnn") => Depthwise::Cudnn,
            _ => Depthwise::Tile,
        }
    }
}

/// Input channels of a convolution are padded with zeros to at least this many.
const CHANNEL_STEP: usize = 8;

/// How many input channels a convolution of fewer than [`CHANNEL_STEP`] (an image's three) is
/// padded to with zeros (others are left as they are), by its element type: 8 in f16 (the
/// tensor cores' step), 16 in bf16, where cuDNN's NHWC kernels for 8 channels ran ResNet-50's
/// stem at a sixth of their rate for 16 (0.345 against 0.058 ms at batch 8 on an H200,
/// `benches/NOTES.md`). `FUSEC_CHANNEL_STEP=N` pads to N instead, at compile time; `0` leaves
/// such a convolution NCHW.
fn channel_step(dtype: DType) -> usize {
    let chosen = crate::knobs::number("FUSEC_CHANNEL_STEP");
    chosen.unwrap_or(if dtype == DType::BF16 { 2 * CHANNEL_STEP } else { CHANNEL_STEP })
}

/// Whether a network of element type `dtype` runs channels-last: in half types always (cuDNN's
/// tensor-core kernels are NHWC); in f32 where it has a depthwise convolution, which only
/// the generated NHWC kernels run well. Measured on an H200 in f32 (`benches/NOTES.md`,
/// twenty-ninth session): channels-last took MobileNetV3-Large at batch 32 from 4.21 to 1.22
/// ms, EfficientNet-B0 from 8.66 to 2.00, ConvNeXt-T from 10.67 to 8.37; ViT-B/16 (one
/// convolution) moved 1–2 %, and ResNet-50's f32 result moved from 9.1e-6 to 2.1e-5 of tract's
/// (rel-L2, over the 1e-5 bound), so networks without a depthwise convolution stay NCHW.
/// `FUSEC_CHANNELS_LAST_F32=1` or `0` decides for f32 networks, for measuring.
pub fn wanted(graph: &Graph, dtype: DType) -> bool {
    match dtype {
        DType::F16 | DType::BF16 => true,
        DType::F32 if crate::knobs::on("FUSEC_CHANNELS_LAST_F32") => true,
        DType::F32 if crate::knobs::off("FUSEC_CHANNELS_LAST_F32") => false,
        DType::F32 => graph.node_ids().any(|id| graph.is_depthwise_conv(id)),
        _ => false,
    }
}

/// Convolutions to NHWC, and the transposes between them cancelled.
pub struct ChannelsLast;

impl Pass for ChannelsLast {
    fn name(&self) -> &'static str {
        "channels-last"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut changed = 0;
        for id in graph.topo_order()? {
            changed += usize::from(to_nhwc(graph, id)?);
        }
        for id in graph.topo_order()? {
            changed += usize::from(windows_as_matmul(graph, id)?);
        }
        if changed == 0 {
            return Ok(0);
        }
        // Each round moves transposes one pointwise op further and cancels the pairs that
        // meet; a network is done in about as many rounds as the longest chain between two
        // convolutions.
        for _ in 0..256 {
            let mut moved = 0;
            for id in graph.topo_order()? {
                if !graph.contains(id) {
                    continue;
                }
                moved += usize::from(
                    sink(graph, id)?
                        || sink_reduce(graph, id)?
                        || sink_pool(graph, id)?
                        || cancel(graph, id)?,
                );
            }
            changed += moved;
            if moved == 0 {
                break;
            }
        }
        graph.remove_unused();
        Ok(changed)
    }
}

/// A tensor of zeros.
fn zero_tensor(dtype: DType, shape: &[usize]) -> Tensor {
    Tensor::from_f64(ndarray::ArrayD::zeros(ndarray::IxDyn(shape)), dtype)
}

fn op_error(graph: &Graph, id: NodeId, message: String) -> IrError {
    let node = graph.node(id);
    IrError::Op { node: node.origin.node.clone(), op: node.op.kind(), message }
}

/// Lets go of constant `id`'s value once nothing reads it (the pass removes the node at its
/// end): a network's filters are not held in both layouts at once.
fn release_if_unread(graph: &mut Graph, id: NodeId) {
    if graph.users_of(id).is_empty() && !graph.outputs().iter().any(|(_, o)| *o == id) {
        graph.take_constant(id);
    }
}

/// Rewrites convolution `id` as `T(conv_nhwc(T(x), W in KRSC))`, if it is one cuDNN takes or a
/// depthwise one the generated kernels run.
fn to_nhwc(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Conv { strides, pads, dilations, group, channels_last: false } = node.op else {
        return Ok(false);
    };
    let inputs = graph.inputs_of(id);
    let symmetric = pads[0] == pads[2] && pads[1] == pads[3];
    let Some(filters) = graph.constant(inputs[1]).cloned() else { return Ok(false) };
    // Asymmetric padding (TensorFlow exports' SAME padding of stride-2 layers) only where the
    // convolution is depthwise and runs as a generated kernel: cuDNN takes symmetric padding.
    let generated = graph.is_depthwise_conv(id) && Depthwise::from_env() != Depthwise::Cudnn;
    if !(symmetric || generated) || node.ty.rank() != 4 {
        return Ok(false);
    }
    // A few input channels (an image's three) are padded with zeros to the element type's
    // step (`channel_step`): cuDNN's NHWC kernels for three channels ran at a fifth of its
    // rate for eight.
    let (channels, step) = (filters.shape()[1], channel_step(node.ty.dtype));
    let pad = group == 1 && channels < CHANNEL_STEP && patches(graph, id).is_none();
    if pad && step == 0 {
        return Ok(false);
    }
    let mut krsc = ops::evaluate(&Op::Transpose { perm: TO_NHWC.to_vec() }, &[&filters])
        .map_err(|m| op_error(graph, id, m))?;
    let origin = node.origin.clone();
    let mut x = graph.add_op(
        Op::Transpose { perm: TO_NHWC.to_vec() },
        &[inputs[0]],
        &format!("{}/input_nhwc", node.name),
        origin.clone(),
    )?;
    if pad && channels < step {
        let mut block = graph.node(x).ty.shape.clone();
        block[3] = step - channels;
        let zero = zero_tensor(krsc.dtype(), &[1, 1, 1, 1]);
        let zero = graph.add_constant(&format!("{}/zero", node.name), Arc::new(zero), origin.clone());
        let zeros = graph.add_op(
            Op::Expand { shape: block },
            &[zero],
            &format!("{}/zeros", node.name),
            origin.clone(),
        )?;
        x = graph.add_op(
            Op::Concat { axis: 3 },
            &[x, zeros],
            &format!("{}/input_padded", node.name),
            origin.clone(),
        )?;
        let mut block = krsc.shape().to_vec();
        block[3] = step - channels;
        let filler = zero_tensor(krsc.dtype(), &block);
        krsc =
            ops::evaluate(&Op::Concat { axis: 3 }, &[&krsc, &filler]).map_err(|m| op_error(graph, id, m))?;
    }
    let w = if krsc.shape()[3] == 1 && group > 1 {
        // Depthwise: the generated loop reads one filter tap for each channel side by side,
        // so the taps are stored channel-innermost (RSCK) and read through a transpose to
        // KRSC; stored KRSC, a warp's reads of one tap were 32 lines apart.
        let rsck = ops::evaluate(&Op::Transpose { perm: vec![1, 2, 3, 0] }, &[&krsc])
            .map_err(|m| op_error(graph, id, m))?;
        let stored = graph.add_constant(&format!("{}/rsck", node.name), Arc::new(rsck), origin.clone());
        let krsc = Op::Transpose { perm: vec![3, 0, 1, 2] };
        graph.add_op(krsc, &[stored], &format!("{}/krsc", node.name), origin.clone())?
    } else {
        graph.add_constant(&format!("{}/krsc", node.name), Arc::new(krsc), origin.clone())
    };
    let mut conv_inputs = vec![x, w];
    conv_inputs.extend(inputs.get(2));
    let conv = Op::Conv { strides, pads, dilations, group, channels_last: true };
    let conv = graph.add_op(conv, &conv_inputs, &format!("{}/nhwc", node.name), origin.clone())?;
    let back = graph.add_op(Op::Transpose { perm: TO_NCHW.to_vec() }, &[conv], &node.name, origin)?;
    graph.replace_uses(id, back);
    graph.remove_node(id);
    release_if_unread(graph, inputs[1]);
    Ok(true)
}

/// The window `[R, S]` of convolution `id` where its windows tile the input exactly, each
/// input element read once: strides equal to the window, no padding, no dilation, one group
/// and a height and width that the window divides (a 1×1 convolution of stride 1; a vision
/// transformer's patch embedding). Its input's patches are then the rows of a GEMM's operand.
fn patches(graph: &Graph, id: NodeId) -> Option<[usize; 2]> {
    let Op::Conv { strides, pads: [0, 0, 0, 0], dilations: [1, 1], group: 1, channels_last } =
        graph.node(id).op
    else {
        return None;
    };
    let inputs = graph.inputs_of(id);
    let (x, w) = (&graph.node(inputs[0]).ty.shape, &graph.node(inputs[1]).ty.shape);
    // NCHW / KCRS, or NHWC / KRSC.
    let (h, wd, r, s, c) = match channels_last {
        false => (*x.get(2)?, *x.get(3)?, *w.get(2)?, *w.get(3)?, *w.get(1)?),
        true => (*x.get(1)?, *x.get(2)?, *w.get(1)?, *w.get(2)?, *w.get(3)?),
    };
    let tiles = strides == [r, s] && h % r == 0 && wd % s == 0;
    // A GEMM's rows in half types want a multiple of 8 elements (16-byte aligned).
    (tiles && (c * r * s) % CHANNEL_STEP == 0).then_some([r, s])
}

/// Rewrites NHWC convolution `id` as a GEMM where its windows tile the input (`patches`):
/// the input's patches, `[N, P, Q, R·S·C]` (a view for a 1×1 window), times the filters
/// `[R·S·C, K]` (+ bias) then run on cuBLASLt with the pointwise ops after it in its
/// epilogue, as a transformer's projections do; a patch embedding's image is rearranged into
/// its rows by the kernel that converts it.
fn windows_as_matmul(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Conv { channels_last: true, .. } = node.op else { return Ok(false) };
    let Some([r, s]) = patches(graph, id) else { return Ok(false) };
    let inputs = graph.inputs_of(id);
    let Some(krsc) = graph.constant(inputs[1]).cloned() else { return Ok(false) };
    let [k, _, _, c] = krsc.shape()[..] else { return Ok(false) };
    // Patches of an NCHW value (the transpose to NHWC looked through) are rows `[C, R, S]`,
    // each window row S elements in a row of the source; of an NHWC value, `[R, S, C]`.
    let source = inputs[0];
    let nchw = match &graph.node(source).op {
        Op::Transpose { perm } if perm[..] == TO_NHWC && [r, s] != [1, 1] => {
            let inner = graph.inputs_of(source)[0];
            match &graph.node(inner).op {
                // NHWC put back into NCHW (ConvNeXt's LayerNorm2d before its downsampling):
                // the two transposes cancel later, and the value is NHWC.
                Op::Transpose { perm } if perm[..] == TO_NCHW => None,
                _ => Some(inner),
            }
        }
        _ => None,
    };
    let filters = match nchw {
        Some(_) => ops::evaluate(&Op::Transpose { perm: TO_NCHW.to_vec() }, &[&krsc])
            .map_err(|m| op_error(graph, id, m))?,
        None => (*krsc).clone(),
    };
    let kc = ops::evaluate(&Op::Reshape { shape: vec![k, r * s * c] }, &[&filters])
        .map_err(|m| op_error(graph, id, m))?;
    let ck =
        ops::evaluate(&Op::Transpose { perm: vec![1, 0] }, &[&kc]).map_err(|m| op_error(graph, id, m))?;
    let origin = node.origin.clone();
    let w = graph.add_constant(&format!("{}/ck", node.name), Arc::new(ck), origin.clone());
    let product = match inputs.get(2) {
        Some(_) => format!("{}/matmul", node.name),
        None => node.name.clone(),
    };
    let mut x = nchw.unwrap_or(source);
    if [r, s] != [1, 1] {
        let [n, h, wd, _] = graph.node(source).ty.shape[..] else { return Ok(false) };
        let (p, q) = (h / r, wd / s);
        let (split, perm) = match nchw {
            Some(_) => (vec![n, c, p, r, q, s], vec![0, 2, 4, 1, 3, 5]),
            None => (vec![n, p, r, q, s, c], vec![0, 1, 3, 2, 4, 5]),
        };
        let steps = [
            (Op::Reshape { shape: split }, "patches"),
            (Op::Transpose { perm }, "patches_t"),
            (Op::Reshape { shape: vec![n, p, q, r * s * c] }, "rows"),
        ];
        for (op, name) in steps {
            x = graph.add_op(op, &[x], &format!("{}/{name}", node.name), origin.clone())?;
        }
    }
    let mut out = graph.add_op(Op::MatMul, &[x, w], &product, origin.clone())?;
    if let Some(&bias) = inputs.get(2) {
        out = graph.add_op(Op::Binary(BinaryOp::Add), &[out, bias], &node.name, origin)?;
    }
    graph.replace_uses(id, out);
    graph.remove_node(id);
    release_if_unread(graph, inputs[1]);
    Ok(true)
}

fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// Moves an NHWC-to-NCHW transpose feeding pool `id` past it: the pool reads NHWC.
fn sink_pool(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Pool { kind, window } = node.op else { return Ok(false) };
    let input = graph.inputs_of(id)[0];
    if window.channels_last || graph.node(input).op != (Op::Transpose { perm: TO_NCHW.to_vec() }) {
        return Ok(false);
    }
    let source = graph.inputs_of(input)[0];
    let pool = Op::Pool { kind, window: PoolWindow { channels_last: true, ..window } };
    let inner = graph.add_op(pool, &[source], &format!("{}/nhwc", node.name), node.origin.clone())?;
    let outer = graph.add_op(Op::Transpose { perm: TO_NCHW.to_vec() }, &[inner], &node.name, node.origin)?;
    graph.replace_uses(id, outer);
    graph.remove_node(id);
    Ok(true)
}

/// Moves the transposes feeding reduction `id` past it where it keeps its axes:
/// `reduce(T(a, P), axes)` becomes `T(reduce(a, P[axes]), P)` (a global pool over NHWC).
fn sink_reduce(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    let Op::Reduce { op, axes, keep_dims: true } = &node.op else { return Ok(false) };
    let input = graph.inputs_of(id)[0];
    let Op::Transpose { perm } = graph.node(input).op.clone() else { return Ok(false) };
    let mut moved: Vec<usize> = axes.iter().map(|&a| perm[a]).collect();
    moved.sort_unstable();
    let source = graph.inputs_of(input)[0];
    let reduce = Op::Reduce { op: *op, axes: moved, keep_dims: true };
    let inner = graph.add_op(reduce, &[source], &format!("{}/moved", node.name), node.origin.clone())?;
    let outer = graph.add_op(Op::Transpose { perm }, &[inner], &node.name, node.origin.clone())?;
    graph.replace_uses(id, outer);
    graph.remove_node(id);
    Ok(true)
}

/// Moves the transposes feeding pointwise op `id` past it: `p(T(a, P), k)` becomes
/// `T(p(a, k'), P)`, with every constant `k` (or broadcast of one) permuted to `a`'s layout. Only where every
/// non-constant input is a transpose by the same permutation of a 4-D value (broadcasting
/// goes axis by axis, so it holds through the permutation).
fn sink(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let node = graph.node(id).clone();
    if !node.op.is_pointwise() || node.ty.rank() != 4 {
        return Ok(false);
    }
    let inputs = graph.inputs_of(id);
    let mut perm: Option<Vec<usize>> = None;
    for &i in &inputs {
        match &graph.node(i).op {
            Op::Transpose { perm: p } if graph.node(i).ty.rank() == 4 => {
                if perm.as_ref().is_some_and(|q| q != p) {
                    return Ok(false);
                }
                perm = Some(p.clone());
            }
            Op::Constant(value) if value.shape().len() <= 4 => {}
            Op::Expand { .. } if broadcast_constant(graph, i).is_some() => {}
            _ => return Ok(false),
        }
    }
    let Some(perm) = perm else { return Ok(false) };
    let inv = inverse(&perm);
    let mut moved = Vec::with_capacity(inputs.len());
    // A constant of rank ≤ 4 in `a`'s layout: left-padded to rank 4, then permuted.
    let permute = |graph: &mut Graph, value: &Tensor, name: String, origin| -> Result<NodeId, IrError> {
        let mut shape = vec![1; 4 - value.shape().len()];
        shape.extend_from_slice(value.shape());
        let reshaped = ops::evaluate(&Op::Reshape { shape }, &[value]).map_err(|m| op_error(graph, id, m))?;
        let permuted = ops::evaluate(&Op::Transpose { perm: inv.clone() }, &[&reshaped])
            .map_err(|m| op_error(graph, id, m))?;
        Ok(graph.add_constant(&name, Arc::new(permuted), origin))
    };
    for &i in &inputs {
        let name = format!("{}/{}", node.name, graph.node(i).name);
        let origin = graph.node(i).origin.clone();
        let input = match (graph.constant(i).cloned(), broadcast_constant(graph, i)) {
            (Some(value), _) => permute(graph, &value, name, origin)?,
            // A broadcast of a constant (a uniform constant is stored as one): the constant
            // permuted, broadcast to the permuted shape.
            (None, Some(value)) => {
                let mut shape = vec![1; 4 - graph.node(i).ty.rank()];
                shape.extend_from_slice(&graph.node(i).ty.shape);
                let source = permute(graph, &value, format!("{name}/source"), origin.clone())?;
                let shape = inv.iter().map(|&k| shape[k]).collect();
                graph.add_op(Op::Expand { shape }, &[source], &name, origin)?
            }
            (None, None) => graph.inputs_of(i)[0],
        };
        moved.push(input);
    }
    let inner =
        graph.add_op(node.op.clone(), &moved, &format!("{}/moved", node.name), node.origin.clone())?;
    let outer = graph.add_op(Op::Transpose { perm }, &[inner], &node.name, node.origin.clone())?;
    graph.replace_uses(id, outer);
    graph.remove_node(id);
    Ok(true)
}

/// The constant that `Expand` node `id` broadcasts, where both are of rank ≤ 4.
fn broadcast_constant(graph: &Graph, id: NodeId) -> Option<Tensor> {
    let Op::Expand { .. } = graph.node(id).op else { return None };
    let value = graph.constant(graph.inputs_of(id)[0])?;
    (graph.node(id).ty.rank() <= 4 && value.shape().len() <= 4).then(|| value.as_ref().clone())
}

/// `T(T(a, P1), P2)` as one transpose, or `a` where the two cancel.
fn cancel(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let Op::Transpose { perm: outer } = &graph.node(id).op else { return Ok(false) };
    let inputs = graph.inputs_of(id);
    let Op::Transpose { perm: inner } = &graph.node(inputs[0]).op else { return Ok(false) };
    let composed: Vec<usize> = outer.iter().map(|&o| inner[o]).collect();
    let source = graph.inputs_of(inputs[0])[0];
    let replacement = if composed.iter().enumerate().all(|(i, &p)| i == p) {
        source
    } else {
        let node = graph.node(id).clone();
        graph.add_op(Op::Transpose { perm: composed }, &[source], &node.name, node.origin)?
    };
    graph.replace_uses(id, replacement);
    graph.remove_node(id);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::inverse;

    #[test]
    fn inverse_permutations_compose_to_the_identity() {
        for perm in [[0, 2, 3, 1], [0, 3, 1, 2], [3, 2, 1, 0]] {
            let inv = inverse(&perm);
            assert!((0..4).all(|i| perm[inv[i]] == i && inv[perm[i]] == i));
        }
    }
}
