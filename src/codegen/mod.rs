//! Kernel specs to CUDA C. Each kernel of a plan becomes one source rendered from a handlebars
//! template (`templates/*.cu.hbs`, strict mode, no escaping) that includes the shared device
//! code of `kernels/fusec.cuh`; Rust supplies the index arithmetic (`index.rs`) and the calls
//! to device functions for each op (`expr.rs`). GEMMs become cuBLAS calls (`gemm.rs`) with an
//! in-place epilogue kernel when the partition fused a bias or an activation into them.
//! Knows nothing of cudarc.

mod attention;
mod expr;
mod gemm;
pub mod index;
mod kernel;
mod row;

use handlebars::Handlebars;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use gemm::{GemmOperand, GemmScale, GemmSpec, LtActivation, LtEpilogue};

use crate::fusion::KernelKind;
use crate::plan::{Location, Plan};

/// The shared device code every kernel includes as `fusec.cuh`.
pub const DEVICE_HEADER: &str = include_str!("../../kernels/fusec.cuh");

const TEMPLATES: &[(&str, &str)] = &[
    ("elementwise", include_str!("../../templates/elementwise.cu.hbs")),
    ("row", include_str!("../../templates/row.cu.hbs")),
    ("row_cached", include_str!("../../templates/row_cached.cu.hbs")),
    ("attention", include_str!("../../templates/attention.cu.hbs")),
    ("attention_mma", include_str!("../../templates/attention_mma.cu.hbs")),
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
}

/// How a kernel of a program for a range of sizes is launched at a size `n` of the range
/// (the bundle's [`crate::bundle::Header::range`], top `high`): `units · n / high` units of
/// work, `per_block` to a block; with `bound`, the kernel takes the units as its last
/// parameter (`long long fusec_limit`) and leaves the rest of its last block idle.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LaunchScale {
    /// Units of work at the top of the range (threads, rows or blocks).
    pub units: u64,
    /// Units per block.
    pub per_block: u64,
    /// Whether the kernel takes the units as a parameter.
    pub bound: bool,
}

/// A size that follows a range, `top` at its top `high`, at size `n` of the range.
pub fn size_at(top: usize, n: usize, high: usize) -> usize {
    top / high.max(1) * n
}

impl LaunchScale {
    /// Units and blocks at size `n` of a range whose top is `high`.
    pub fn at(&self, n: usize, high: usize) -> (u64, u32) {
        let units = size_at(self.units as usize, n, high) as u64;
        (units, units.div_ceil(self.per_block.max(1)).clamp(1, u64::from(u32::MAX)) as u32)
    }
}

impl KernelSource {
    pub(crate) fn new(name: &str, source: String, grid: u32, block: u32, args: Vec<Location>) -> Self {
        KernelSource { name: name.into(), function: name.into(), source, grid, block, args, scale: None }
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

/// The parameter list with the run-time bound of a scaled kernel appended.
pub(crate) fn with_limit(params: String, scaled: bool) -> String {
    if scaled {
        format!("{params}, long long fusec_limit")
    } else {
        params
    }
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
    },
}

impl Step {
    /// Every kernel source this step launches.
    pub fn sources(&self) -> impl Iterator<Item = &KernelSource> {
        let (a, b) = match self {
            Step::Launch(k) => (Some(k), None),
            Step::Gemm { epilogue, .. } => (None, epilogue.as_ref()),
        };
        a.into_iter().chain(b)
    }

    /// Launches per run: a GEMM whose epilogue cuBLASLt runs is one launch.
    pub fn launches(&self) -> usize {
        match self {
            Step::Launch(_) => 1,
            Step::Gemm { gemm, epilogue } => {
                1 + usize::from(epilogue.is_some() && gemm.lt_epilogue.is_none())
            }
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
    plan.kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            let fail =
                |message: String| CodegenError::Kernel { kernel: k, kind: kernel.kind.name(), message };
            let kind = kernel.kind.name().replace(['+', ':'], "_").to_lowercase();
            let name = format!("fusec_k{k}_{kind}");
            let mut step = match &kernel.kind {
                KernelKind::Gemm { .. } => gemm::generate(plan, kernel, &name, &hb).map_err(fail)?,
                _ => kernel::generate(plan, kernel, &name, &hb).map(Step::Launch).map_err(fail)?,
            };
            if plan.scaled(kernel) {
                scale_launch(plan, kernel, &mut step).map_err(fail)?;
            }
            let narrow = index::fits_i32(plan, kernel);
            match &mut step {
                Step::Launch(source) | Step::Gemm { epilogue: Some(source), .. } => {
                    if narrow {
                        source.source = index::narrow(&source.source);
                    }
                    share(source, &kind, &mut functions);
                }
                Step::Gemm { epilogue: None, .. } => {}
            }
            Ok(step)
        })
        .collect()
}

/// Sets how `step`'s launches (and a GEMM's sizes) follow the plan's range. The kernels are
/// generated for the top of the range; `bound` kernels test the run-time units.
fn scale_launch(plan: &Plan, kernel: &crate::fusion::Kernel, step: &mut Step) -> Result<(), String> {
    let Some(range) = &plan.range else { return Ok(()) };
    let high = range.high as u64;
    // Kernels with a bound set their scale as they are generated; the others launch one
    // block per unit of work.
    let set = |source: &mut KernelSource| -> Result<(), String> {
        let scale = *source.scale.get_or_insert(LaunchScale {
            units: u64::from(source.grid),
            per_block: 1,
            bound: false,
        });
        if scale.units % high != 0 {
            return Err(format!(
                "its {} units of work are not a multiple of {}={high}",
                scale.units, range.symbol
            ));
        }
        Ok(())
    };
    match step {
        Step::Launch(source) => set(source)?,
        Step::Gemm { gemm, epilogue } => {
            let out = *kernel.outputs.first().ok_or("a GEMM without an output")?;
            let node = plan.graph.node(out);
            let axis =
                range.axes.get(&out).copied().ok_or("a GEMM whose output does not follow the range")?;
            let rank = node.ty.rank();
            // A batch of products over a shared B is one product of the rows stacked (batch 1).
            gemm.scales = Some(if axis + 2 < rank && gemm.batch > 1 {
                GemmScale::Batch
            } else if axis + 2 <= rank {
                GemmScale::M
            } else {
                return Err(format!("GEMM '{}' has its columns follow the range", node.name));
            });
            let scaled = match gemm.scales {
                Some(GemmScale::Batch) => gemm.batch,
                _ => gemm.m,
            };
            if scaled % range.high != 0 {
                return Err(format!(
                    "GEMM '{}': {scaled} is not a multiple of {}={high}",
                    node.name, range.symbol
                ));
            }
            if let Some(source) = epilogue {
                set(source)?;
            }
        }
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
    let hash = crate::bundle::checksum(body.as_bytes());
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
