//! Kernel specs to CUDA C. Each kernel of a plan becomes one source rendered from a handlebars
//! template (`templates/*.cu.hbs`, strict mode, no escaping) that includes the shared device
//! code of `kernels/fusec.cuh`; Rust supplies the index arithmetic (`index.rs`) and the calls
//! to device functions for each op (`expr.rs`). GEMMs become cuBLAS calls (`gemm.rs`) with an
//! in-place epilogue kernel when the partition fused a bias or an activation into them.
//! Knows nothing of cudarc.

mod attention;
mod conv;
mod depthwise;
mod elementwise;
mod expr;
mod gate;
mod gemm;
pub mod index;
mod index_checks;
mod kernel;
mod pool;
mod row;
mod siblings;
mod skinny;

use handlebars::Handlebars;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use conv::{ConvFusion, ConvSpec};
pub use gemm::{GemmDims, GemmOperand, GemmSpec, LtActivation, LtEpilogue};
pub use index_checks::{index_checks, index_fault_code, index_limits};

use crate::fusion::KernelKind;
use crate::ir::SymDim;
use crate::plan::{Location, Plan};

/// The shared device code every kernel includes as `fusec.cuh`.
pub const DEVICE_HEADER: &str = include_str!("../../kernels/fusec.cuh");

const TEMPLATES: &[(&str, &str)] = &[
    ("elementwise", include_str!("../../templates/elementwise.cu.hbs")),
    ("row", include_str!("../../templates/row.cu.hbs")),
    ("row_cached", include_str!("../../templates/row_cached.cu.hbs")),
    ("attention", include_str!("../../templates/attention.cu.hbs")),
    ("attention_mma", include_str!("../../templates/attention_mma.cu.hbs")),
    ("attention_decode", include_str!("../../templates/attention_decode.cu.hbs")),
    ("attention_decode_rows", include_str!("../../templates/attention_decode_rows.cu.hbs")),
    ("gate", include_str!("../../templates/gate.cu.hbs")),
    ("depthwise", include_str!("../../templates/depthwise.cu.hbs")),
    ("skinny_gemm", include_str!("../../templates/skinny_gemm.cu.hbs")),
    ("skinny_mma", include_str!("../../templates/skinny_mma.cu.hbs")),
    ("skinny_staged", include_str!("../../templates/skinny_staged.cu.hbs")),
    // Partials of the two above.
    ("skinny_rows_weights", include_str!("../../templates/skinny_rows_weights.cu.hbs")),
    ("skinny_rows_fragment", include_str!("../../templates/skinny_rows_fragment.cu.hbs")),
    ("attention_qkv_fetch", include_str!("../../templates/attention_qkv_fetch.cu.hbs")),
    ("attention_qkv_compute", include_str!("../../templates/attention_qkv_compute.cu.hbs")),
    ("attention_decode_softmax", include_str!("../../templates/attention_decode_softmax.cu.hbs")),
    ("attention_outproj_fetch", include_str!("../../templates/attention_outproj_fetch.cu.hbs")),
    ("attention_outproj", include_str!("../../templates/attention_outproj.cu.hbs")),
];

/// A kernel that could not be generated.
#[derive(Debug, Error)]
pub enum CodegenError {
    /// One kernel of the plan.
    #[error("codegen: kernel {kernel} ({kind}): {message}")]
    Kernel {
        /// Its position in the plan.
        kernel: usize,
        /// Its kind (`pointwise`, `row`, `attention`, …).
        kind: String,
        /// What is wrong.
        message: String,
    },
    /// A template failed to parse or render.
    #[error("codegen: template {0}")]
    Template(String),
}

/// One kernel launch: the step's name (`fusec_k<step>_<kind>`, for profiles), the CUDA
/// function it runs, its launch shape and where its pointer parameters point.
///
/// Kernels of identical layers differ only in the memory they touch, which is passed as
/// parameters: their sources are the same, named after a hash of the source, and compiled
/// and stored once.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelSource {
    /// The step's name (`fusec_k<step>_<kind>`).
    pub name: String,
    /// The entry point in `source`, and the key of its PTX in a bundle and the NVRTC cache.
    pub function: String,
    /// The CUDA C source.
    pub source: String,
    /// Blocks per launch.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// The kernel's arguments, one device pointer each, in parameter order.
    pub args: Vec<Location>,
    /// In a bundle for a range of sizes, how the launch follows the size (`None`: as is).
    #[serde(default)]
    pub scale: Option<LaunchScale>,
    /// The same kernel tiled for other points of the ranges (an attention kernel of a bundle
    /// for ranges): the launch at a point takes the one whose tiling the point calls for
    /// ([`AttentionDims::tiling_at`]), this one where none is.
    #[serde(default)]
    pub variants: Vec<KernelSource>,
    /// The tiling of a tensor-core attention kernel that has variants.
    #[serde(default)]
    pub tiling: Option<Tiling>,
    /// The sizes that choose among `variants`.
    #[serde(default)]
    pub attention: Option<Box<AttentionDims>>,
    /// The steps this kernel also runs (pointwise kernels merged into its launch, `siblings`):
    /// the runtime leaves them out.
    #[serde(default)]
    pub merges: Vec<usize>,
}

/// How the tensor-core attention kernel is tiled: warps of 16 query rows per block, warps
/// sharing each row group's keys, keys per shared-memory tile, tiles in flight.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Tiling {
    /// Query warps per block.
    pub warps: usize,
    /// Warps sharing each query warp's keys.
    pub splits: usize,
    /// Keys per tile.
    pub kt: usize,
    /// Key and value buffers in shared memory.
    pub buffers: usize,
    /// Blocks of a thread-block cluster sharing each query block's key tiles (1: none).
    #[serde(default = "one")]
    pub cluster: usize,
}

fn one() -> usize {
    1
}

/// The sizes of an attention kernel of a bundle for ranges, as expressions of them, that
/// choose its tiling at a point.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch × heads.
    pub heads: SymDim,
    /// Query rows.
    pub queries: SymDim,
    /// Keys.
    pub keys: SymDim,
    /// Keys at the top of the ranges (the primary kernel's tiling is for them).
    pub top_keys: usize,
    /// The head size.
    pub depth: usize,
    /// The value width.
    pub dv: usize,
}

impl AttentionDims {
    /// The tiling the kernel takes at the point `values`: a bundle for one size of the
    /// point's batch × heads and queries would take it, with the keys of its class (up to 128:
    /// one tile of all of them; more: the top's).
    pub fn tiling_at(&self, values: &[usize]) -> Option<Tiling> {
        let keys = self.keys.eval(values)?;
        Some(attention::mma_tiling(
            self.heads.eval(values)?,
            self.queries.eval(values)?,
            self.key_class(keys),
            self.depth,
            self.dv,
        ))
    }

    /// The keys a point with `keys` keys is tiled for.
    pub fn key_class(&self, keys: usize) -> usize {
        if keys <= 128 {
            self.top_keys.min(128)
        } else {
            self.top_keys
        }
    }
}

/// How a kernel of a program for ranges of sizes is launched at a point of them (the sizes
/// of the bundle's [`crate::bundle::Header::ranges`], in order): `units` units of work,
/// `per_block` to a block, that many blocks `times` over; with `bound`, the kernel takes the
/// units as a parameter (`long long fusec_limit`) and leaves the rest of its last block
/// idle. Every such kernel takes the point's sizes as its last parameters (`fusec_d<i>`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LaunchScale {
    /// Units of work (threads, rows or query tiles' rows).
    pub units: SymDim,
    /// Units per block.
    pub per_block: u64,
    /// How many times the blocks of the units are launched (batch × heads of attention).
    pub times: SymDim,
    /// Whether the kernel takes the units as a parameter.
    pub bound: bool,
}

impl LaunchScale {
    /// `units` units, `per_block` to a block.
    pub fn new(units: SymDim, per_block: u64, bound: bool) -> Self {
        LaunchScale { units, per_block, times: SymDim::lit(1), bound }
    }

    /// Units and blocks at the point `values`; `None` where they overflow.
    pub fn at(&self, values: &[usize]) -> Option<(u64, u32)> {
        let units = self.units.eval(values)? as u64;
        let times = self.times.eval(values)? as u64;
        let blocks = units.div_ceil(self.per_block.max(1)).checked_mul(times)?;
        Some((units, u32::try_from(blocks.max(1)).ok()?))
    }
}

impl KernelSource {
    pub(crate) fn new(name: &str, source: String, grid: u32, block: u32, args: Vec<Location>) -> Self {
        KernelSource {
            name: name.into(),
            function: name.into(),
            source,
            grid,
            block,
            args,
            scale: None,
            variants: Vec::new(),
            tiling: None,
            attention: None,
            merges: Vec::new(),
        }
    }
}

/// The bound a kernel's template tests its units against: a literal, or the run-time
/// parameter of a kernel whose launch follows a range (`scaled`).
pub(crate) fn limit(units: usize, scaled: bool) -> String {
    if scaled {
        "fusec_limit".into()
    } else {
        format!("{units}LL")
    }
}

/// The parameter list of a kernel of `plan`: for a program for ranges of sizes, the run-time
/// bound (where the kernel is `bound`) and every range's size appended.
pub(crate) fn with_limit(plan: &Plan, params: String, bound: bool) -> String {
    let Some(symbolic) = &plan.symbolic else { return params };
    let mut params = params;
    if bound {
        params.push_str(", long long fusec_limit");
    }
    for i in 0..symbolic.symbols.len() {
        params.push_str(&format!(", long long {}", crate::ir::symbol_param(i)));
    }
    params
}

/// One step of the program: a kernel launch, or a cuBLAS GEMM with an optional epilogue.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Step {
    /// A generated kernel.
    Launch(KernelSource),
    /// A cuBLAS or cuBLASLt GEMM.
    Gemm {
        /// The product.
        gemm: GemmSpec,
        /// The kernel that runs after it on its output, unless cuBLASLt runs the epilogue.
        epilogue: Option<KernelSource>,
        /// fusec's kernel for the same product and epilogue where A has a few rows
        /// (`skinny.rs`): the runtime runs it instead of the call where it makes the program
        /// faster.
        #[serde(default)]
        skinny: Option<KernelSource>,
        /// `skinny` with narrower column tiles (`skinny::Tiling::Narrow`), a second such
        /// kernel timed against it at load; it takes in what `skinny` takes in.
        #[serde(default)]
        skinny_narrow: Option<Box<KernelSource>>,
        /// The step before, a norm `skinny` computes itself from its input: left out where
        /// `skinny` (or `skinny_narrow`) runs.
        #[serde(default)]
        absorbs: Option<usize>,
    },
    /// A cuDNN convolution.
    Conv {
        /// The convolution.
        conv: ConvSpec,
        /// The kernel that runs after it on its output: the bias and the fused pointwise ops.
        epilogue: Option<KernelSource>,
    },
}

impl Step {
    /// Every kernel source this step launches, variants included.
    pub fn sources(&self) -> impl Iterator<Item = &KernelSource> {
        let (a, b, c) = match self {
            Step::Launch(k) => (Some(k), None, None),
            Step::Gemm { epilogue, skinny, skinny_narrow, .. } => {
                (skinny.as_ref(), skinny_narrow.as_deref(), epilogue.as_ref())
            }
            Step::Conv { epilogue, .. } => (None, None, epilogue.as_ref()),
        };
        a.into_iter().chain(b).chain(c).flat_map(|k| std::iter::once(k).chain(k.variants.iter()))
    }

    /// [`Step::sources`] but the kernels for a few rows of a GEMM step (alternatives to the
    /// library call, chosen at load): the kernels the program runs as compiled.
    pub fn program_sources(&self) -> impl Iterator<Item = &KernelSource> {
        let few_rows: Vec<&str> = match self {
            Step::Gemm { skinny, skinny_narrow, .. } => {
                skinny.iter().chain(skinny_narrow.as_deref()).map(|k| k.function.as_str()).collect()
            }
            _ => Vec::new(),
        };
        self.sources().filter(move |k| !few_rows.contains(&k.function.as_str()))
    }

    /// Launches per run: a GEMM whose epilogue cuBLASLt runs is one launch.
    pub fn launches(&self) -> usize {
        match self {
            Step::Launch(_) => 1,
            Step::Gemm { gemm, epilogue, .. } => {
                1 + usize::from(epilogue.is_some() && gemm.lt_epilogue.is_none())
            }
            Step::Conv { epilogue, .. } => 1 + usize::from(epilogue.is_some()),
        }
    }
}

fn templates() -> Result<Handlebars<'static>, CodegenError> {
    let mut hb = Handlebars::new();
    hb.set_strict_mode(true);
    hb.register_escape_fn(handlebars::no_escape);
    for (name, text) in TEMPLATES {
        hb.register_template_string(name, *text)
            .map_err(|e| CodegenError::Template(format!("{name}: {e}")))?;
    }
    Ok(hb)
}

/// Generates the program for `plan`: one step per kernel, in order.
pub fn generate(plan: &Plan) -> Result<Vec<Step>, CodegenError> {
    let hb = templates()?;
    let mut functions = std::collections::HashMap::new();
    let mut steps = plan
        .kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            let fail =
                |message: String| CodegenError::Kernel { kernel: k, kind: kernel.kind.name(), message };
            let kind = kernel.kind.name().replace(['+', ':'], "_").to_lowercase();
            let name = format!("fusec_k{k}_{kind}");
            let mut step = match &kernel.kind {
                KernelKind::Gemm { .. } => gemm::generate(plan, k, kernel, &name, &hb).map_err(fail)?,
                KernelKind::Conv => conv::generate(plan, kernel, &name, &hb).map_err(fail)?,
                KernelKind::Single { op } if op == "ChannelGate" => {
                    gate::generate(plan, kernel, &name, &hb).map(Step::Launch).map_err(fail)?
                }
                _ => elementwise::generate(plan, kernel, &name, &hb).map(Step::Launch).map_err(fail)?,
            };
            if plan.scaled() {
                follows_ranges(&step).map_err(fail)?;
            }
            let narrow = index::fits_i32(plan, kernel);
            match &mut step {
                Step::Launch(source)
                | Step::Gemm { epilogue: Some(source), .. }
                | Step::Conv { epilogue: Some(source), .. } => {
                    for variant in &mut source.variants {
                        if narrow {
                            variant.source = index::narrow(&variant.source);
                        }
                        share(variant, &kind, &mut functions);
                    }
                    if narrow {
                        source.source = index::narrow(&source.source);
                    }
                    share(source, &kind, &mut functions);
                }
                Step::Gemm { epilogue: None, .. } | Step::Conv { epilogue: None, .. } => {}
            }
            if let Step::Gemm { skinny, skinny_narrow, .. } = &mut step {
                for source in skinny.iter_mut().chain(skinny_narrow.as_deref_mut()) {
                    share(source, "skinny_gemm", &mut functions);
                }
            }
            Ok(step)
        })
        .collect::<Result<Vec<Step>, CodegenError>>()?;
    siblings::merge(plan, &mut steps, &mut |kernel| share(kernel, "pointwise", &mut functions));
    Ok(steps)
}

/// Checks that every kernel of a step of a program for ranges of sizes says how its launch
/// follows them (a GEMM's sizes are set as its spec is made: none where they are static,
/// whose kernel for a few rows is then launched as it is at every point).
fn follows_ranges(step: &Step) -> Result<(), String> {
    let missing = match step {
        Step::Gemm { epilogue, .. } => epilogue.iter().any(|s| s.scale.is_none()),
        _ => step.sources().any(|s| s.scale.is_none()),
    };
    if missing {
        return Err("its launch does not follow the ranges of sizes".into());
    }
    Ok(())
}

/// Stands in for the function's name while sources are compared.
const PLACEHOLDER: &str = "FUSEC_FUNCTION";

/// Names `kernel`'s function after its source with local names renumbered
/// ([`canonical_names`]), so that kernels of identical layers run one function. `functions`
/// holds each function's source so far: a hash shared by two different sources gets a
/// suffix, never the other's code.
fn share(kernel: &mut KernelSource, kind: &str, functions: &mut std::collections::HashMap<String, String>) {
    let body = canonical_names(&kernel.source.replace(&kernel.name, PLACEHOLDER));
    let hash = crate::checksum::checksum(body.as_bytes());
    let mut function = format!("fusec_{kind}_{:012x}", hash >> 16);
    let mut n = 1;
    while let Some(existing) = functions.get(&function) {
        if *existing == body {
            break;
        }
        n += 1;
        function = format!("fusec_{kind}_{:012x}_{n}", hash >> 16);
    }
    kernel.source = body.replace(PLACEHOLDER, &function);
    functions.insert(function.clone(), body);
    kernel.function = function;
}

/// Local names the generators number by node (`v12`, `s12`, `raw12`, `in12`, `out12`)
/// renumbered in order of first use, each prefix on its own: a one-to-one renaming, so the
/// code means the same, and a kernel's source no longer depends on where in the graph its
/// nodes are.
pub fn canonical_names(source: &str) -> String {
    const PREFIXES: [&str; 5] = ["raw", "out", "in", "v", "s"];
    let bytes = source.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut numbers: std::collections::HashMap<(&str, &str), usize> = Default::default();
    let mut counts = [0usize; PREFIXES.len()];
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        if !word(bytes[i]) {
            let start = i;
            while i < bytes.len() && !word(bytes[i]) {
                i += 1;
            }
            out.push_str(&source[start..i]);
            continue;
        }
        let start = i;
        while i < bytes.len() && word(bytes[i]) {
            i += 1;
        }
        let token = &source[start..i];
        let renamed = PREFIXES.iter().enumerate().find_map(|(p, prefix)| {
            let digits = token.strip_prefix(prefix)?;
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some((p, *prefix, digits))
        });
        match renamed {
            Some((p, prefix, digits)) => {
                let n = *numbers.entry((prefix, digits)).or_insert_with(|| {
                    counts[p] += 1;
                    counts[p] - 1
                });
                out.push_str(prefix);
                out.push_str(&n.to_string());
            }
            None => out.push_str(token),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::canonical_names;

    #[test]
    fn local_names_are_renumbered_consistently() {
        let a = "const float v12 = in7[i] + v3; out12[i] = v12 * s9 + raw4 + float4_x + v2x;";
        let b = "const float v40 = in31[i] + v35; out40[i] = v40 * s2 + raw8 + float4_x + v2x;";
        let expected = "const float v0 = in0[i] + v1; out0[i] = v0 * s0 + raw0 + float4_x + v2x;";
        assert_eq!(canonical_names(a), expected);
        assert_eq!(canonical_names(b), expected);
        // Literals and longer identifiers are left alone.
        assert_eq!(canonical_names("x = 12LL + 1.5e3f; inner2 = v1;"), "x = 12LL + 1.5e3f; inner2 = v0;");
    }
}
