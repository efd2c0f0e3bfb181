//! GEMM steps: a cuBLAS call described by a [`GemmSpec`], and, when the partition fused a
//! bias, an activation or ONNX Gemm's `beta·C` into it, an elementwise epilogue kernel that
//! rewrites the GEMM's output in place.
//!
//! Operands are row-major; cuBLAS is column-major. A row-major `[M, K]` matrix is a
//! column-major `[K, M]` one, so `C = A·B` is computed as `Cᵀ = Bᵀ·Aᵀ`: the runtime passes B
//! first and swaps M and N (see `runtime::gemm`).

use handlebars::Handlebars;
use serde::{Deserialize, Serialize};

use super::kernel;
use super::Step;
use crate::fusion::Kernel;
use crate::ir::SymDim;
use crate::ir::{DType, NodeId, Op};
use crate::plan::{Location, Plan};

/// One operand: a row-major matrix (or batch of them) in memory.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GemmOperand {
    /// Where the matrix (the first of the batch) starts.
    pub location: Location,
    /// The stored matrix is the transpose of the logical operand.
    pub transposed: bool,
    /// Elements between consecutive matrices of a batch (0: the same matrix for all).
    pub batch_stride: usize,
}

/// `C[b] = alpha · A[b] · B[b]` for `batch` row-major `[M, K] · [K, N]` products.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GemmSpec {
    /// The left operand, `[M, K]`.
    pub a: GemmOperand,
    /// The right operand, `[K, N]`.
    pub b: GemmOperand,
    /// Where `C`, `[M, N]` per batch and contiguous, is written.
    pub c: Location,
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// Products in the batch.
    pub batch: usize,
    /// The scale of the product.
    pub alpha: f32,
    /// Element type of A, B and C; accumulation is f32.
    pub dtype: crate::ir::DType,
    /// C's element type where it is not `dtype`: f32 where the kernel takes in the cast of a
    /// half-type product to f32 (`fusion::partition`'s widening), stored by the GEMM itself.
    #[serde(default)]
    pub out: Option<crate::ir::DType>,
    /// The epilogue as cuBLASLt can run it inside the GEMM (bias, then an optional
    /// activation). The step's epilogue kernel stays in the bundle as the fallback for a
    /// GPU where cuBLASLt has no algorithm for it.
    #[serde(default)]
    pub lt_epilogue: Option<LtEpilogue>,
    /// In a bundle for ranges of sizes, its sizes as expressions of them (`None`: as is).
    #[serde(default)]
    pub dims: Option<Box<GemmDims>>,
}

/// The sizes of a GEMM of a program for ranges of sizes, at any point of them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GemmDims {
    /// Rows of A and C.
    pub m: SymDim,
    /// Columns of B and C.
    pub n: SymDim,
    /// The shared dimension.
    pub k: SymDim,
    /// Products in the batch.
    pub batch: SymDim,
    /// A's batch stride.
    pub a_stride: SymDim,
    /// B's batch stride.
    pub b_stride: SymDim,
}

impl GemmDims {
    /// Whether every size is one size at every point of the ranges.
    fn is_static(&self) -> bool {
        [&self.m, &self.n, &self.k, &self.batch, &self.a_stride, &self.b_stride].iter().all(|d| d.is_static())
    }
}

impl GemmSpec {
    /// C's element type.
    pub fn c_dtype(&self) -> crate::ir::DType {
        self.out.unwrap_or(self.dtype)
    }

    /// The GEMM at the point `values` of the bundle's ranges (itself without ranges); `None`
    /// where a size overflows.
    pub fn at(&self, values: &[usize]) -> Option<GemmSpec> {
        let Some(d) = &self.dims else { return Some(self.clone()) };
        let mut spec = self.clone();
        spec.m = d.m.eval(values)?;
        spec.n = d.n.eval(values)?;
        spec.k = d.k.eval(values)?;
        spec.batch = d.batch.eval(values)?;
        spec.a.batch_stride = d.a_stride.eval(values)?;
        spec.b.batch_stride = d.b_stride.eval(values)?;
        Some(spec)
    }
}

/// What cuBLASLt applies to the product before it is stored:
/// `act(scale·A·B + residual + bias)`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LtEpilogue {
    /// A vector of N elements (the GEMM's element type), added to every row.
    pub bias: Option<Location>,
    /// Applied after the bias and the residual.
    pub activation: LtActivation,
    /// A stored value of the result's type and layout added with the bias, before the
    /// activation (cuBLASLt's `β·C`, β = 1).
    pub residual: Option<Location>,
    /// A uniform factor of the product (a `Mul` by one value right after the GEMM), which
    /// cuBLASLt applies as α (on top of the GEMM's own); f32 bits, so that the type stays `Eq`.
    pub scale_bits: u32,
}

impl LtEpilogue {
    /// The product's factor.
    pub fn scale(&self) -> f32 {
        f32::from_bits(self.scale_bits)
    }

    /// Its steps in order, e.g. `scale+bias+residual+relu`.
    pub fn describe(&self) -> String {
        let steps = [
            (self.scale() != 1.0).then_some("scale"),
            self.bias.map(|_| "bias"),
            self.residual.map(|_| "residual"),
            match self.activation {
                LtActivation::None => None,
                LtActivation::Relu => Some("relu"),
                LtActivation::GeluTanh => Some("gelutanh"),
            },
        ];
        steps.into_iter().flatten().collect::<Vec<_>>().join("+")
    }
}

/// An activation cuBLASLt can apply in its epilogue.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum LtActivation {
    /// None: the bias and residual only.
    None,
    /// max(x, 0).
    Relu,
    /// cuBLASLt's GELU is the tanh approximation: only `GeluTanh` maps to it, never erf-GELU
    /// (half-type programs compute an erf-GELU after a GEMM in this form unless asked not to:
    /// `passes::gelu_after_gemm_as_tanh`).
    GeluTanh,
}

/// The stored value an operand reads, and whether it reads it transposed (last two axes).
pub(super) fn resolve(plan: &Plan, mut id: NodeId) -> Result<(Location, bool), String> {
    let graph = &plan.graph;
    let mut transposed = false;
    loop {
        if let Some(&location) = plan.locations.get(&id) {
            return Ok((location, transposed));
        }
        let node = graph.node(id);
        match &node.op {
            Op::Reshape { .. } | Op::Identity | Op::Dropout if !transposed => {}
            Op::Transpose { perm } if !transposed => {
                let n = perm.len();
                let last_two =
                    n >= 2 && perm[..n - 2].iter().enumerate().all(|(i, &p)| i == p) && perm[n - 2] == n - 1;
                if !last_two {
                    return Err(format!("GEMM operand '{}' is a transpose cuBLAS cannot read", node.name));
                }
                transposed = true;
            }
            op if op.is_view() => {
                return Err(format!("GEMM operand '{}' is a {} cuBLAS cannot read", node.name, op.kind()))
            }
            _ => return Err(format!("GEMM operand '{}' is not in memory", node.name)),
        }
        id = graph.inputs_of(id)[0];
    }
}

/// A's or B's batch stride: 0 for one matrix shared by the batch, else the matrix's size.
fn batch_stride(batch: &SymDim, total: &SymDim, matrix: &SymDim) -> Result<SymDim, String> {
    match total.div(matrix) {
        Some(b) if b.is_one() => Ok(SymDim::lit(0)),
        Some(b) if b == *batch => Ok(matrix.clone()),
        b => Err(format!(
            "broadcasting a batch of {} to {} is not supported yet (only all-or-nothing batch broadcasting)",
            b.map_or("?".into(), |b| b.c()),
            batch.c()
        )),
    }
}

pub(super) fn spec(plan: &Plan, gemm: NodeId, out: Location) -> Result<GemmSpec, String> {
    let graph = &plan.graph;
    let node = graph.node(gemm);
    if !matches!(node.ty.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(format!("{} GEMMs are not supported yet", node.ty.dtype));
    }
    let dtype = node.ty.dtype;
    let inputs = graph.inputs_of(gemm);
    let (a_shape, b_shape) = (plan.dims(inputs[0]), plan.dims(inputs[1]));
    let ((a_loc, a_t), (b_loc, b_t)) = (resolve(plan, inputs[0])?, resolve(plan, inputs[1])?);
    let (flag_a, flag_b, alpha) = match node.op {
        Op::Gemm { alpha, trans_a, trans_b, .. } => (trans_a, trans_b, alpha),
        _ => (false, false, 1.0),
    };
    let one = SymDim::lit(1);
    let a2 = if a_shape.len() == 1 { vec![one.clone(), a_shape[0].clone()] } else { a_shape };
    let b2 = if b_shape.len() == 1 { vec![b_shape[0].clone(), one.clone()] } else { b_shape };
    let (ra, ca) = (&a2[a2.len() - 2], &a2[a2.len() - 1]);
    let (rb, cb) = (&b2[b2.len() - 2], &b2[b2.len() - 1]);
    let (m, k) = if flag_a { (ca.clone(), ra.clone()) } else { (ra.clone(), ca.clone()) };
    let n = if flag_b { rb.clone() } else { cb.clone() };
    let (a_total, b_total) = (SymDim::product(&a2), SymDim::product(&b2));
    let out_total = SymDim::product(&plan.dims(gemm));
    let mn = m.mul(&n);
    let batch = if mn.factor == 0 {
        one.clone()
    } else {
        out_total.div(&mn).ok_or("a GEMM whose batch is not whole")?
    };
    let a_transposed = a_t ^ flag_a;
    let b_transposed = b_t ^ flag_b;
    let top_values = plan.symbolic.as_ref().map(|s| crate::ir::tops(&s.symbols)).unwrap_or_default();
    let top = |d: &SymDim| d.eval(&top_values).unwrap_or(0);
    // A shared right operand and a plain left one: fold the batch into M, one GEMM.
    let dims = if b_total == k.mul(&n) && !a_transposed && !batch.is_one() {
        let zero = SymDim::lit(0);
        GemmDims { m: m.mul(&batch), n, k, batch: one, a_stride: zero.clone(), b_stride: zero }
    } else {
        let a_stride = batch_stride(&batch, &a_total, &m.mul(&k))?;
        let b_stride = batch_stride(&batch, &b_total, &k.mul(&n))?;
        GemmDims { m, n, k, batch, a_stride, b_stride }
    };
    let a = GemmOperand { location: a_loc, transposed: a_transposed, batch_stride: top(&dims.a_stride) };
    let b = GemmOperand { location: b_loc, transposed: b_transposed, batch_stride: top(&dims.b_stride) };
    Ok(GemmSpec {
        a,
        b,
        c: out,
        m: top(&dims.m),
        n: top(&dims.n),
        k: top(&dims.k),
        batch: top(&dims.batch),
        alpha,
        dtype,
        out: None,
        lt_epilogue: None,
        // In a program for ranges, the sizes as they follow them; none where every size is the
        // same at every point (such a product is the top's everywhere, and may run as the
        // kernel for a few rows).
        dims: (plan.symbolic.is_some() && !dims.is_static()).then(|| Box::new(dims)),
    })
}

/// The step of a GEMM kernel of the plan: the call, its epilogue kernel if it has one, and
/// fusec's kernel for a product of a few rows where it can run it.
pub fn generate(
    plan: &Plan,
    index: usize,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<Step, String> {
    let graph = &plan.graph;
    let gemm = kernel.nodes[0];
    let output = *kernel.outputs.first().ok_or("a GEMM kernel with no output")?;
    let out = *plan.locations.get(&output).ok_or("the GEMM's output has no memory")?;
    let mut spec = spec(plan, gemm, out)?;
    spec.lt_epilogue = lt_epilogue(plan, kernel, gemm, &spec);
    let c_input = match graph.node(gemm).op {
        Op::Gemm { beta, .. } if beta != 0.0 => graph.inputs_of(gemm).get(2).copied(),
        _ => None,
    };
    // A product widened to f32 (its kernel's epilogue the cast alone, behind reshapes): C is
    // stored as f32 by the GEMM, no epilogue kernel.
    spec.out = kernel.kind.widens().then_some(DType::F32);
    let epilogue = if spec.out.is_none() && (kernel.nodes.len() > 1 || c_input.is_some()) {
        Some(epilogue(plan, kernel, gemm, out, name, hb)?)
    } else {
        None
    };
    // The kernel for a few rows: with the norm (or gate) right before it taken in where it can
    // be, else without.
    use super::skinny::{Prologue, Tiling};
    let next = super::skinny::next_weights(plan, index);
    let few_rows = |prologue, tiling| {
        super::skinny::generate(&spec, (epilogue.is_some(), tiling), (prologue, next), name, hb)
    };
    let norm = super::skinny::norm_before(plan, index, gemm, &spec);
    let gate = norm.is_none().then(|| super::skinny::gate_before(plan, index, gemm, &spec)).flatten();
    let prologue = norm.as_ref().map(Prologue::Norm).or(gate.as_ref().map(Prologue::Gate));
    let (skinny, absorbs) = match prologue {
        Some(prologue) => match few_rows(Some(prologue), Tiling::Wide)? {
            Some(kernel) => (Some(kernel), Some(prologue.step())),
            None => (few_rows(None, Tiling::Wide)?, None),
        },
        None => (few_rows(None, Tiling::Wide)?, None),
    };
    // The same kernel with narrower column tiles, taking in what it takes in.
    let skinny_narrow = match skinny {
        Some(_) => few_rows(absorbs.and(prologue), Tiling::Narrow)?.map(Box::new),
        None => None,
    };
    Ok(Step::Gemm { gemm: spec, epilogue, skinny, skinny_narrow, absorbs })
}

/// The kernel's epilogue as cuBLASLt runs it, when it is exactly: at most one `Mul` by a
/// uniform constant right after the GEMM (cuBLASLt's α), at most one bias vector over N (a
/// MatMul's `Add` of a constant, or an ONNX Gemm's C with beta 1) and at most one residual
/// (an `Add` of a stored value of the result's type, cuBLASLt's β·C), then at most one ReLU or
/// tanh-GELU, on a GEMM that is not batched or whose operands are both batches (the bias
/// shared by every product).
pub(super) fn lt_epilogue(plan: &Plan, kernel: &Kernel, gemm: NodeId, spec: &GemmSpec) -> Option<LtEpilogue> {
    use crate::ir::{BinaryOp, UnaryOp};
    let graph = &plan.graph;
    let strided = spec.a.batch_stride != 0 && spec.b.batch_stride != 0;
    if (spec.batch != 1 && !strided)
        || kernel.outputs.len() != 1
        || kernel.outputs[0] != *kernel.nodes.last()?
    {
        return None;
    }
    let mut bias = match graph.node(gemm).op {
        Op::Gemm { beta, .. } if beta != 0.0 && graph.inputs_of(gemm).len() == 3 => {
            if beta != 1.0 {
                return None;
            }
            Some(graph.inputs_of(gemm)[2])
        }
        _ => None,
    };
    let (mut activation, mut residual, mut scale) = (None, None, None);
    for (position, &id) in kernel.nodes.iter().enumerate().skip(1) {
        let other = || graph.inputs_of(id).into_iter().find(|i| !kernel.nodes.contains(i));
        match graph.node(id).op {
            Op::Reshape { .. } => {}
            // A uniform factor, right after the GEMM (before a bias it would scale too).
            Op::Binary(BinaryOp::Mul) if position == 1 && bias.is_none() => {
                scale = Some(uniform(plan, other()?)? as f32);
            }
            Op::Binary(BinaryOp::Add) if activation.is_none() => {
                let other = other()?;
                if graph.constant(other).is_some() {
                    if bias.replace(other).is_some() {
                        return None;
                    }
                } else {
                    // A residual: a stored value of the result's type.
                    if residual.is_some() || graph.node(other).ty != graph.node(id).ty {
                        return None;
                    }
                    residual = Some(*plan.locations.get(&super::conv::source(plan, other)?)?);
                }
            }
            Op::Unary(UnaryOp::Relu) if activation.is_none() => activation = Some(LtActivation::Relu),
            Op::Unary(UnaryOp::GeluTanh) if activation.is_none() => activation = Some(LtActivation::GeluTanh),
            _ => return None,
        }
    }
    let bias = match bias {
        Some(bias) => {
            // A constant: its value is in the weights blob, its type on the node.
            graph.constant(bias)?;
            let ty = &graph.node(bias).ty;
            if ty.len() != spec.n || ty.shape.last() != Some(&spec.n) || ty.dtype != spec.dtype {
                return None;
            }
            let location @ Location::Weights(_) = *plan.locations.get(&bias)? else { return None };
            Some(location)
        }
        None if activation.is_none() && residual.is_none() && scale.is_none() => return None,
        None => None,
    };
    Some(LtEpilogue {
        bias,
        activation: activation.unwrap_or(LtActivation::None),
        residual,
        scale_bits: scale.unwrap_or(1.0).to_bits(),
    })
}

/// The bias and the residual of `kernel`'s epilogue (the GEMM `gemm`'s), where the epilogue is
/// at most those two: no activation, no scale, or no epilogue but reshapes. What a kernel that
/// computes the product itself (`codegen::attention`'s `qkv` and `outproj`) can take in.
pub(super) fn bias_and_residual(
    plan: &Plan,
    kernel: &Kernel,
    gemm: NodeId,
    spec: &GemmSpec,
) -> Option<(Option<Location>, Option<Location>)> {
    let graph = &plan.graph;
    let reshapes = kernel.nodes.iter().skip(1).all(|&n| matches!(graph.node(n).op, Op::Reshape { .. }));
    let c_input = matches!(graph.node(gemm).op, Op::Gemm { beta, .. } if beta != 0.0 && graph.inputs_of(gemm).len() == 3);
    match lt_epilogue(plan, kernel, gemm, spec) {
        Some(e) if e.activation == LtActivation::None && e.scale() == 1.0 => Some((e.bias, e.residual)),
        None if reshapes && !c_input => Some((None, None)),
        _ => None,
    }
}

/// The one value of constant `id` (or a broadcast or reshape of one), if all its elements are
/// alike.
fn uniform(plan: &Plan, mut id: NodeId) -> Option<f64> {
    while !plan.locations.contains_key(&id) {
        match plan.graph.node(id).op {
            Op::Expand { .. } | Op::Reshape { .. } | Op::Identity => {
                id = *plan.graph.inputs_of(id).first()?
            }
            _ => return None,
        }
    }
    match plan.constant_pattern(id)? {
        crate::plan::Pattern::Uniform(value) => Some(value),
        crate::plan::Pattern::Lower { .. } => None,
    }
}

/// The GEMM's raw result sits in the output buffer; this kernel reads it there and writes
/// the fused epilogue's result over it, element by element.
fn epilogue(
    plan: &Plan,
    kernel: &Kernel,
    gemm: NodeId,
    out: Location,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<super::KernelSource, String> {
    let beta_c = match plan.graph.node(gemm).op {
        Op::Gemm { beta, .. } if beta != 0.0 && plan.graph.inputs_of(gemm).len() == 3 => Some(beta),
        _ => None,
    };
    super::elementwise::elementwise(
        plan,
        kernel,
        name,
        hb,
        Some(kernel::GemmRaw { node: gemm, location: out, beta_c, finished: beta_c.is_none() }),
    )
}
