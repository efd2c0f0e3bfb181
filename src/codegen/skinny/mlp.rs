//! A decoder layer's MLP at a few rows as one kernel (`templates/skinny_mlp.cu.hbs`): the
//! product before this one (its activation, and the norm before it) and this one, in one
//! launch where they were two or three. At a decoding step each kernel is one more dependent
//! phase on the step's chain, and a phase costs ~1.7 µs on an H200 however little it reads
//! (`benches/NOTES.md`, twenty-seventh session); the hidden layer (`[M, H]`) never reaches
//! memory. Each block owns a slice of the hidden columns: it takes the norm of A itself, its
//! slice of the first product on tensor cores, then its share of the second, which it adds into
//! a buffer of f32 sums; the last block done with a set of columns applies the epilogue and
//! stores C. The runtime times it against the two products' own kernels at load and keeps it
//! only where the program is faster. `FUSEC_SKINNY_MLP=0` (at compile time) leaves it out.

use handlebars::Handlebars;
use serde_json::json;

use super::super::expr::{c_type, header, load, narrow};
use super::super::gemm::{self, GemmSpec, LtActivation};
use super::super::kernel::render;
use super::super::KernelSource;
use super::{aligned, norm_before};
use crate::fusion::KernelKind;
use crate::ir::{DType, Op};
use crate::knobs;
use crate::plan::{Location, Plan};

/// The most rows the kernel takes (its second product's sums, `rows / 8` tiles a warp, in
/// registers).
pub const MAX_ROWS: usize = 32;

/// Hidden columns a block.
const SLICE: usize = 32;

/// The most elements of C (the buffer of sums the kernel's module holds).
const MAX_SUMS: usize = 1 << 20;

/// The most bytes of shared memory a block (of the H100's and H200's 227 KB).
const MAX_SHARED: usize = 200 << 10;

/// The kernel for GEMM kernel `index` (product `down`) and the GEMM kernel before it, where
/// that one's output (after its activation) is this one's A and nothing else's: both static
/// products of at most [`MAX_ROWS`] rows in a half type, weights stored `[K, N]`, epilogues
/// cuBLASLt could run (the first without a residual). The norm before the first product is
/// taken in where the first product's kernel for a few rows could take it
/// ([`super::norm_before`]). Its `merges` are the steps it stands in for.
pub fn generate(
    plan: &Plan,
    index: usize,
    down: &GemmSpec,
    name: &str,
    hb: &Handlebars<'_>,
) -> Result<Option<KernelSource>, String> {
    let Some(up_index) = index.checked_sub(1) else { return Ok(None) };
    let up_kernel = &plan.kernels[up_index];
    if knobs::off("FUSEC_SKINNY_MLP")
        || !matches!(up_kernel.kind, KernelKind::Gemm { .. })
        || up_kernel.kind.widens()
        || up_kernel.outputs.len() != 1
        || !up_kernel.store_views.is_empty()
    {
        return Ok(None);
    }
    let Ok((up, needs_epilogue)) = gemm::product(plan, up_kernel) else { return Ok(None) };
    let up_epilogue = up.lt_epilogue;
    if (needs_epilogue && up_epilogue.is_none()) || up_epilogue.is_some_and(|e| e.residual.is_some()) {
        return Ok(None);
    }
    // This product's A is the one before's output, through views read by nothing else.
    let graph = &plan.graph;
    let view = |id| matches!(graph.node(id).op, Op::Reshape { .. } | Op::Identity);
    let hidden = up_kernel.outputs[0];
    let mut a = graph.inputs_of(plan.kernels[index].nodes[0])[0];
    while a != hidden {
        if !view(a) || graph.users_of(a).len() != 1 {
            return Ok(None);
        }
        a = graph.inputs_of(a)[0];
    }
    if graph.users_of(hidden).len() != 1 || plan.outputs.iter().any(|b| b.value == hidden) {
        return Ok(None);
    }
    let dtype = down.dtype;
    let (m, k, h, n) = (up.m, up.k, up.n, down.n);
    let weights = |g: &GemmSpec| matches!(g.b.location, Location::Weights(_)) && aligned(g.b.location);
    let plain = |g: &GemmSpec| {
        g.dims.is_none()
            && g.batch == 1
            && !g.a.transposed
            && !g.b.transposed
            && g.out.is_none()
            && g.dtype == dtype
    };
    if !matches!(dtype, DType::F16 | DType::BF16)
        || !plain(&up)
        || !plain(down)
        || down.m != m
        || down.k != h
        || down.a.location != up.c
        || m == 0
        || m > MAX_ROWS
        || k % 16 != 0
        || h % SLICE != 0
        || n % 32 != 0
        || m * n > MAX_SUMS
        || !weights(&up)
        || !weights(down)
    {
        return Ok(None);
    }
    let norm = norm_before(plan, up_index, up_kernel.nodes[0], &up);
    let x = norm.map_or(up.a.location, |n| n.x);
    let term = norm.and_then(|n| n.sum).map(|(y, _)| y);
    if !std::iter::once(x).chain(term).all(aligned)
        || norm.is_some_and(|n| !std::iter::once(n.gamma).chain(n.beta).all(aligned))
    {
        return Ok(None);
    }
    let m_pad = m.div_ceil(8) * 8;
    let shared = m_pad * (k + 8) * dtype.size_bytes()
        + 8 * SLICE * m_pad * 4
        + m_pad * (SLICE + 8) * dtype.size_bytes();
    if shared > MAX_SHARED {
        return Ok(None);
    }
    let t = c_type(dtype)?;
    let mut params = vec![
        format!("const {t}* __restrict__ a_in"),
        format!("const {t}* __restrict__ w1_in"),
        format!("const {t}* __restrict__ w2_in"),
        // Not restricted: the residual may be read from the output's own memory.
        format!("{t}* c_out"),
    ];
    let mut args = vec![x, up.b.location, down.b.location, down.c];
    let up_bias = up_epilogue.and_then(|e| e.bias);
    if let Some(b) = up_bias {
        params.push(format!("const {t}* __restrict__ up_bias"));
        args.push(b);
    }
    let epilogue = down.lt_epilogue;
    let (bias, residual) = (epilogue.and_then(|e| e.bias), epilogue.and_then(|e| e.residual));
    // C, its bias and residual in packs of four.
    if !std::iter::once(down.c).chain(bias).chain(residual).chain(up_epilogue.and_then(|e| e.bias)).all(aligned) {
        return Ok(None);
    }
    if let Some(b) = bias {
        params.push(format!("const {t}* __restrict__ bias"));
        args.push(b);
    }
    if let Some(r) = residual {
        params.push(format!("const {t}* residual"));
        args.push(r);
    }
    if let Some(norm) = norm {
        params.push(format!("const {t}* __restrict__ gamma"));
        args.push(norm.gamma);
        if let Some(beta) = norm.beta {
            params.push(format!("const {t}* __restrict__ beta"));
            args.push(beta);
        }
        if let Some((y, stored)) = norm.sum {
            params.push(format!("const {t}* __restrict__ a_term"));
            args.push(y);
            if let Some(stored) = stored {
                params.push(format!("{t}* __restrict__ h_out"));
                args.push(stored);
            }
        }
    }
    let activation = |e: Option<gemm::LtEpilogue>| match e.map(|e| e.activation) {
        Some(LtActivation::Relu) => "fusec::relu(r)",
        Some(LtActivation::GeluTanh) => "fusec::gelu_tanh(r)",
        None | Some(LtActivation::None) => "r",
    };
    let alpha = |g: &GemmSpec| format!("{:?}f", g.alpha * g.lt_epilogue.map_or(1.0, |e| e.scale()));
    let describe = |e: Option<gemm::LtEpilogue>, what: &str| match e {
        Some(e) => format!("{what} ({})", e.describe()),
        None => what.to_string(),
    };
    let name = format!("{name}_skinny_mlp");
    let data = json!({
        "name": name,
        "headers": header(dtype).into_iter().collect::<Vec<_>>(),
        "describe": describe(epilogue, "H · W2"),
        "up_describe": describe(up_epilogue, if norm.is_some() { "the product of A's norm" } else { "the product" }),
        "t": t,
        "m": m,
        "m_pad": m_pad,
        "k": k,
        "h": h,
        "n": n,
        "params": params.join(", "),
        "up_alpha": alpha(&up),
        "up_bias": up_bias.is_some(),
        "load_up_bias": load("up_bias[h0 + c]", dtype),
        "up_activation": activation(up_epilogue),
        "store_h": narrow("r", dtype),
        "alpha": alpha(down),
        "bias": bias.is_some(),
        "residual": residual.is_some(),
        "activation": activation(epilogue),
        "norm": norm.is_some(),
        "rms": norm.is_some_and(|n| n.rms),
        "beta": norm.is_some_and(|n| n.beta.is_some()),
        "summed": term.is_some(),
        "store_sum": norm.and_then(|n| n.sum).is_some_and(|(_, stored)| stored.is_some()),
        "epsilon": format!("{:?}f", norm.map_or(0.0, |n| n.epsilon)),
    });
    let source = render(hb, "skinny_mlp", &data)?;
    let mut kernel = KernelSource::new(&name, source, (h / SLICE) as u32, 256, args);
    kernel.shared = shared as u32;
    kernel.merges = norm.map(|n| n.step).into_iter().chain([up_index]).collect();
    Ok(Some(kernel))
}
