//! Convolutions as library calls: a 2-D convolution of static shape (but for a batch that
//! follows a bundle's range) in f32, f16 or bf16 with symmetric padding runs on cuDNN (its
//! algorithm chosen by measurement when a session loads, or first runs at another batch), writing its raw result into the kernel's output; the bias and the fused pointwise
//! ops after it run as one epilogue kernel that reads that result element by element and
//! writes over it. Any other convolution stays a generated loop (`Body::conv_loop`).

use handlebars::Handlebars;
use serde::{Deserialize, Serialize};

use super::index::Coords;
use super::kernel::{Body, GemmRaw, LANE, TILE_FIRST, TILE_OFFSET};
use super::Step;
use crate::fusion::Kernel;
use crate::ir::{BinaryOp, DType, NodeId, Op, SymDim, UnaryOp};
use crate::passes::Depthwise;
use crate::plan::{Location, Plan};

/// One cuDNN convolution forward, NCHW or NHWC, `y = conv(x, w)` (no bias: the epilogue adds
/// it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConvSpec {
    /// The input `[N, C, H, W]`.
    pub x: Location,
    /// The filters `[K, C / group, R, S]`.
    pub w: Location,
    /// Where the raw result `[N, K, P, Q]` is written.
    pub y: Location,
    /// The input's shape.
    pub x_shape: [usize; 4],
    /// The filters' shape.
    pub w_shape: [usize; 4],
    /// The result's shape.
    pub y_shape: [usize; 4],
    /// Padding along height and width (the same at both ends).
    pub pads: [usize; 2],
    /// Strides along height and width.
    pub strides: [usize; 2],
    /// Dilations along height and width.
    pub dilations: [usize; 2],
    /// Groups the channels are split into.
    pub group: usize,
    /// The element type of x, w and y (f32, f16 or bf16); cuDNN accumulates in f32.
    pub dtype: DType,
    /// x and y are NHWC and w KRSC in memory (the shapes above are NCHW / KCRS all the same).
    pub channels_last: bool,
    /// The epilogue as cuDNN's fused convolution–bias–activation can run it, where it is one:
    /// the session runs that in place of the epilogue kernel if cuDNN takes it at load.
    pub fused: Option<ConvFusion>,
    /// In a bundle for ranges, the batch where it follows them (`x_shape[0]` and `y_shape[0]`
    /// are its size at their top; every other size is static): the session sets the
    /// convolution up again at each point's batch ([`ConvSpec::at`]).
    #[serde(default)]
    pub batch: Option<SymDim>,
}

/// `y = relu?(conv(x, w) + z + bias)`: what `cudnnConvolutionBiasActivationForward` computes.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConvFusion {
    /// The bias, `[K]` of the convolution's type.
    pub bias: Location,
    /// A residual added before the activation (`z`), of the result's shape and layout.
    pub residual: Option<Location>,
    /// Whether a ReLU follows (else the identity).
    pub relu: bool,
}

impl ConvSpec {
    /// The convolution at the point `values` of the bundle's ranges (itself where its batch
    /// does not follow them); `None` where the batch overflows.
    pub fn at(&self, values: &[usize]) -> Option<ConvSpec> {
        let mut spec = self.clone();
        if let Some(batch) = &self.batch {
            let n = batch.eval(values)?;
            spec.x_shape[0] = n;
            spec.y_shape[0] = n;
        }
        Some(spec)
    }

    /// Multiply-adds times two.
    pub fn flops(&self) -> u64 {
        let [_, c, r, s] = self.w_shape;
        let outputs: usize = self.y_shape.iter().product();
        2 * (outputs * c * r * s) as u64
    }
}

/// The spec of convolution node `conv` writing its raw result to `y`, if cuDNN takes it:
/// static shapes but for a batch that follows a range, f32, f16 or bf16, padding the same at
/// both ends.
fn spec(plan: &Plan, conv: NodeId, y: Location) -> Option<ConvSpec> {
    let graph = &plan.graph;
    let Op::Conv { strides, pads, dilations, group, channels_last } = graph.node(conv).op else {
        return None;
    };
    let inputs = graph.inputs_of(conv);
    // Shapes as NCHW / KCRS (the descriptors' order whatever the layout).
    let four = |id: NodeId| -> Option<[usize; 4]> {
        let s: [usize; 4] = graph.node(id).ty.shape.as_slice().try_into().ok()?;
        Some(if channels_last { [s[0], s[3], s[1], s[2]] } else { s })
    };
    let dtype = graph.node(conv).ty.dtype;
    let symmetric = pads[0] == pads[2] && pads[1] == pads[3];
    if graph.is_depthwise_conv(conv) && Depthwise::from_env() != Depthwise::Cudnn {
        return None;
    }
    let (x_dims, y_dims) = (plan.dims(inputs[0]), plan.dims(conv));
    let batch_only = x_dims.len() == 4
        && y_dims.len() == 4
        && x_dims[0] == y_dims[0]
        && x_dims[1..].iter().chain(&y_dims[1..]).all(SymDim::is_static);
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || !symmetric || !batch_only {
        return None;
    }
    Some(ConvSpec {
        x: *plan.locations.get(&source(plan, inputs[0])?)?,
        w: *plan.locations.get(&source(plan, inputs[1])?)?,
        y,
        x_shape: four(inputs[0])?,
        w_shape: four(inputs[1])?,
        y_shape: four(conv)?,
        pads: [pads[0], pads[1]],
        strides,
        dilations,
        group,
        dtype,
        channels_last,
        fused: None,
        batch: (!x_dims[0].is_static()).then(|| x_dims[0].clone()),
    })
}

/// The epilogue of convolution kernel `kernel` as cuDNN's fused form, if it is one: the
/// convolution with its bias, then at most an addition of a stored value of the result's
/// type and at most a ReLU, the last of them the kernel's one output.
fn fusion(plan: &Plan, kernel: &Kernel) -> Option<ConvFusion> {
    let graph = &plan.graph;
    let conv = kernel.nodes[0];
    let bias = *plan.locations.get(&source(plan, *graph.inputs_of(conv).get(2)?)?)?;
    let (mut last, mut residual, mut relu) = (conv, None, false);
    for &n in &kernel.nodes[1..] {
        let inputs = graph.inputs_of(n);
        match graph.node(n).op {
            Op::Binary(BinaryOp::Add) if residual.is_none() && !relu && inputs.len() == 2 => {
                let other = match (inputs[0] == last, inputs[1] == last) {
                    (true, false) => inputs[1],
                    (false, true) => inputs[0],
                    _ => return None,
                };
                if graph.node(other).ty != graph.node(conv).ty {
                    return None;
                }
                residual = Some(*plan.locations.get(&source(plan, other)?)?);
            }
            Op::Unary(UnaryOp::Relu) if !relu && inputs == [last] => relu = true,
            _ => return None,
        }
        last = n;
    }
    (kernel.outputs == [last]).then_some(ConvFusion { bias, residual, relu })
}

/// The four axes of an NHWC (or KRSC) value in NCHW (KCRS) order.
pub(super) fn nchw_order<T: Clone>(v: &[T]) -> Vec<T> {
    vec![v[0].clone(), v[3].clone(), v[1].clone(), v[2].clone()]
}

/// The stored value `id` is read from: itself, or what a chain of free reshapes reads.
pub(super) fn source(plan: &Plan, mut id: NodeId) -> Option<NodeId> {
    while !plan.locations.contains_key(&id) {
        let node = plan.graph.node(id);
        match node.op {
            Op::Reshape { .. } | Op::Identity | Op::Dropout => id = *plan.graph.inputs_of(id).first()?,
            _ => return None,
        }
    }
    Some(id)
}

/// The step of a convolution kernel: a cuDNN call and its epilogue kernel where cuDNN takes
/// the convolution (its raw result in the kernel's output, which must be the convolution's
/// shape), else the generated loop.
pub fn generate(plan: &Plan, kernel: &Kernel, name: &str, hb: &Handlebars<'_>) -> Result<Step, String> {
    let conv = kernel.nodes[0];
    let output = *kernel.outputs.first().ok_or("a convolution kernel with no output")?;
    let graph = &plan.graph;
    let fits = kernel.outputs.len() == 1 && graph.node(output).ty == graph.node(conv).ty;
    let library = plan.locations.get(&output).copied().filter(|_| fits).and_then(|y| spec(plan, conv, y));
    let Some(mut spec) = library else {
        return super::elementwise::elementwise(plan, kernel, name, hb, None).map(Step::Launch);
    };
    let with_bias = graph.inputs_of(conv).len() == 3;
    // cuDNN's fused form is taken or refused at load, by the algorithm chosen for the shape
    // (and, for a convolution set up again at each batch of a bundle's ranges, at each batch):
    // the epilogue kernel runs where it is refused.
    spec.fused = fusion(plan, kernel);
    let epilogue = if kernel.nodes.len() > 1 || with_bias {
        let raw = GemmRaw { node: conv, location: spec.y, beta_c: None, finished: !with_bias };
        Some(super::elementwise::elementwise(plan, kernel, name, hb, Some(raw))?)
    } else {
        None
    };
    Ok(Step::Conv { conv: spec, epilogue })
}

impl Body<'_> {
    /// The value of convolution `id` at `coords` in a library convolution's epilogue: its
    /// result without the bias, at the element's own linear index, plus the bias.
    pub(super) fn library_conv_value(&mut self, id: NodeId, coords: &Coords) -> Result<String, String> {
        let raw = self.gemm.map(|g| g.location).ok_or("a convolution without its result")?;
        let (inputs, dtype) = (self.plan.graph.inputs_of(id), self.plan.graph.node(id).ty.dtype);
        let name = format!("raw{}", id.index());
        self.declare(&name, raw, dtype, false)?;
        let shape = self.dims(id);
        let raw = self.element(&name, coords, &shape, dtype)?;
        let channels_last = matches!(self.plan.graph.node(id).op, Op::Conv { channels_last: true, .. });
        let channel = if channels_last { coords[3].clone() } else { coords[1].clone() };
        Ok(match inputs.get(2) {
            Some(&bias) => {
                let bias = self.read(bias, vec![channel])?;
                format!("({raw} + {bias})")
            }
            None => raw,
        })
    }

    /// The value of convolution `id` at `coords` (n, k, p, q; n, p, q, k channels-last) as a
    /// loop over its window, for convolutions cuDNN does not take.
    pub(super) fn conv_loop(
        &mut self,
        id: NodeId,
        coords: &Coords,
        strides: [usize; 2],
        pads: [usize; 4],
        dilations: [usize; 2],
        (group, channels_last): (usize, bool),
    ) -> Result<String, String> {
        if let Some(tile) = self.shared_depthwise {
            return self.shared_depthwise_value(id, strides, pads, dilations, tile);
        }
        let graph = &self.plan.graph;
        let inputs = graph.inputs_of(id);
        let mut x: Vec<String> = self.dims(inputs[0]).iter().map(SymDim::c).collect();
        let mut w = graph.node(inputs[1]).ty.shape.clone();
        let mut coords = coords.clone();
        if let Some(value) =
            self.depthwise_packs(id, &coords, strides, pads, dilations, (group, channels_last))?
        {
            return Ok(value);
        }
        if channels_last {
            // Read as NCHW / KCRS names; the reads below put the axes back in their order.
            (x, w, coords) = (nchw_order(&x), nchw_order(&w), nchw_order(&coords));
        }
        let cout_per_group = w[0] / group;
        let (acc, ci, kh, kw) = (self.fresh("acc"), self.fresh("ci"), self.fresh("kh"), self.fresh("kw"));
        let (n, co, oh, ow) = (&coords[0], &coords[1], &coords[2], &coords[3]);
        let channel = format!("(({co} / {cout_per_group}LL) * {}LL + {ci})", w[1]);
        let ih = format!("({oh} * {}LL + {kh} * {}LL - {}LL)", strides[0], dilations[0], pads[0]);
        let iw = format!("({ow} * {}LL + {kw} * {}LL - {}LL)", strides[1], dilations[1], pads[1]);
        let (x_at, w_at) = if channels_last {
            (
                vec![n.clone(), ih.clone(), iw.clone(), channel],
                vec![co.clone(), kh.clone(), kw.clone(), ci.clone()],
            )
        } else {
            (
                vec![n.clone(), channel, ih.clone(), iw.clone()],
                vec![co.clone(), ci.clone(), kh.clone(), kw.clone()],
            )
        };
        let xr = self.read(inputs[0], x_at)?;
        let wr = self.read(inputs[1], w_at)?;
        let bias = match inputs.get(2) {
            Some(&b) => self.read(b, vec![co.clone()])?,
            None => "0.0f".into(),
        };
        // The window's taps unrolled where it is small (a depthwise 7×7 is 49 loads and
        // FMAs from one base, no loop), the row's bounds checked once per row.
        let unroll = if w[2] * w[3] <= 64 { "\n#pragma unroll\n" } else { " " };
        self.statements.push(format!(
            "float {acc} = {bias}; for (long long {ci} = 0; {ci} < {}LL; ++{ci}) {{{unroll}for (long long {kh} = 0; {kh} < {}LL; ++{kh}) {{ if ({ih} < 0 || {ih} >= {}) continue;{unroll}for (long long {kw} = 0; {kw} < {}LL; ++{kw}) {{ if ({iw} < 0 || {iw} >= {}) continue; {acc} += {xr} * {wr}; }} }} }}",
            w[1], w[2], x[2], w[3], x[3]
        ));
        Ok(acc)
    }

    /// A depthwise convolution in NHWC inside a lane loop over its channels: each tap is one
    /// pack load of the input and one of the (tap-major) filters for all the thread's
    /// channels, accumulated before the loop; each lane's value is then its accumulator (and
    /// bias). `None` where the reads are not packs along the channels.
    fn depthwise_packs(
        &mut self,
        id: NodeId,
        coords: &Coords,
        strides: [usize; 2],
        pads: [usize; 4],
        dilations: [usize; 2],
        (group, channels_last): (usize, bool),
    ) -> Result<Option<String>, String> {
        let graph = &self.plan.graph;
        let inputs = graph.inputs_of(id).to_vec();
        let Some(count) = self.lane_count() else { return Ok(None) };
        let x_dims = self.dims(inputs[0]);
        let w = graph.node(inputs[1]).ty.shape.clone();
        let depthwise =
            channels_last && graph.is_depthwise_conv(id) && x_dims.get(3) == Some(&SymDim::lit(group));
        if !depthwise || w[0] != group || coords.last().map(String::as_str) != Some(LANE) {
            return Ok(None);
        }
        let (n, oh, ow) = (&coords[0], &coords[1], &coords[2]);
        let (kh, kw, column) = (self.fresh("kh"), self.fresh("kw"), self.fresh("x"));
        let ih = format!("({oh} * {}LL + {kh} * {}LL - {}LL)", strides[0], dilations[0], pads[0]);
        // One column per thread: the tap's own column; a tile: the row's `column`-th from
        // the tile's first input column.
        let tile = self.tile();
        let iw = match tile {
            Some(_) => format!("({TILE_FIRST} * {}LL + {column} - {}LL)", strides[1], pads[1]),
            None => format!("({ow} * {}LL + {kw} * {}LL - {}LL)", strides[1], dilations[1], pads[1]),
        };
        let Some((x_ptr, x_at, x_type)) =
            self.pack_address(inputs[0], vec![n.clone(), ih.clone(), iw.clone(), LANE.into()])?
        else {
            return Ok(None);
        };
        let Some((w_ptr, w_at, w_type)) =
            self.pack_address(inputs[1], vec![LANE.into(), kh.clone(), kw.clone(), "0".into()])?
        else {
            return Ok(None);
        };
        let pack = |dtype: DType| -> Result<String, String> {
            Ok(format!("fusec::Pack<{}, {count}>", super::expr::c_type(dtype)?))
        };
        let (x_pack, w_pack) = (pack(x_type)?, pack(w_type)?);
        let (acc, xq, wq) = (self.fresh("dw"), self.fresh("xq"), self.fresh("wq"));
        let (h, width) = (x_dims[1].c(), x_dims[2].c());
        let rows = format!(
            "\n#pragma unroll\nfor (long long {kh} = 0; {kh} < {}LL; ++{kh}) {{ if ({ih} < 0 || {ih} >= {h}) continue;",
            w[1]
        );
        let weights = format!(
            "\n#pragma unroll\nfor (long long {kw} = 0; {kw} < {}LL; ++{kw}) {{ const {w_pack} {wq} = *reinterpret_cast<const {w_pack}*>({w_ptr} + {w_at});",
            w[2]
        );
        let product = |x: &str| {
            format!(
                "{} * {}",
                super::expr::load(&format!("{x}.v[u]"), x_type),
                super::expr::load(&format!("{wq}.v[u]"), w_type)
            )
        };
        let value = match tile {
            // Each input row's columns for the whole tile loaded once (zeros in the padding),
            // every tap of the row then read from registers.
            Some(columns) => {
                let loaded = (columns - 1) * strides[1] + (w[2] - 1) * dilations[1] + 1;
                let t = self.fresh("t");
                let tap = format!("{xq}[{t} * {} + {kw} * {}]", strides[1], dilations[1]);
                self.push_prologue(format!(
                    "float {acc}[{columns}][{count}] = {{}};{rows} {x_pack} {xq}[{loaded}];\n#pragma unroll\nfor (int {column} = 0; {column} < {loaded}; ++{column}) {xq}[{column}] = fusec::load_or_zero(reinterpret_cast<const {x_pack}*>({x_ptr} + {x_at}), {iw} >= 0 && {iw} < {width});{weights}\n#pragma unroll\nfor (int {t} = 0; {t} < {columns}; ++{t})\n#pragma unroll\nfor (int u = 0; u < {count}; ++u) {acc}[{t}][u] += {}; }} }}",
                    product(&tap)
                ));
                format!("{acc}[{TILE_OFFSET}]")
            }
            None => {
                self.push_before_lanes(format!(
                    "float {acc}[{count}] = {{}};{rows}{weights} if ({iw} < 0 || {iw} >= {width}) continue; const {x_pack} {xq} = *reinterpret_cast<const {x_pack}*>({x_ptr} + {x_at});\n#pragma unroll\nfor (int u = 0; u < {count}; ++u) {acc}[u] += {}; }} }}",
                    product(&xq)
                ));
                acc
            }
        };
        Ok(Some(match inputs.get(2) {
            Some(&b) => format!("({value}[j] + {})", self.read(b, vec![LANE.into()])?),
            None => format!("{value}[j]"),
        }))
    }
}
