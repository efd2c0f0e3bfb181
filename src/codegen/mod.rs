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

pub use gemm::{GemmOperand, GemmSpec, LtActivation, LtEpilogue};

use crate::fusion::KernelKind;
use crate::plan::Plan;

/// The shared device code every kernel includes as `fusec.cuh`.
pub const DEVICE_HEADER: &str = include_str!("../../kernels/fusec.cuh");

const TEMPLATES: &[(&str, &str)] = &[
    ("elementwise", include_str!("../../templates/elementwise.cu.hbs")),
    ("row", include_str!("../../templates/row.cu.hbs")),
    ("row_cached", include_str!("../../templates/row_cached.cu.hbs")),
    ("attention", include_str!("../../templates/attention.cu.hbs")),
    ("attention_mma", include_str!("../../templates/attention_mma.cu.hbs")),
];

#[derive(Debug, Error)]
pub enum CodegenError {
    #[error("codegen: kernel {kernel} ({kind}): {message}")]
    Kernel { kernel: usize, kind: String, message: String },
    #[error("codegen: template {0}")]
    Template(String),
}

/// One CUDA kernel: its source and launch shape.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelSource {
    pub name: String,
    pub source: String,
    pub grid: u32,
    pub block: u32,
}

/// One step of the program: a kernel launch, or a cuBLAS GEMM with an optional epilogue.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Step {
    Launch(KernelSource),
    Gemm { gemm: GemmSpec, epilogue: Option<KernelSource> },
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
    plan.kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            let fail =
                |message: String| CodegenError::Kernel { kernel: k, kind: kernel.kind.name(), message };
            let name = format!("fusec_k{k}_{}", kernel.kind.name().replace(['+', ':'], "_").to_lowercase());
            let mut step = match &kernel.kind {
                KernelKind::Gemm { .. } => gemm::generate(plan, kernel, &name, &hb).map_err(fail)?,
                _ => kernel::generate(plan, kernel, &name, &hb).map(Step::Launch).map_err(fail)?,
            };
            if index::fits_i32(plan, kernel) {
                match &mut step {
                    Step::Launch(source) | Step::Gemm { epilogue: Some(source), .. } => {
                        source.source = index::narrow(&source.source)
                    }
                    Step::Gemm { epilogue: None, .. } => {}
                }
            }
            Ok(step)
        })
        .collect()
}
