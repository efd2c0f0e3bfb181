//! `fusec run`: run a bundle (or an ONNX model, compiled in memory) on the GPU.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use fusec::import::{run_tract, InputSpec};
use fusec::ir::{max_abs_diff, rel_l2, Tensor};
use fusec::tensor_io::{read_tensor, write_npy};
use fusec::{Bundle, CompileOptions};

/// Relative L2 error allowed against the CPU reference in fp32.
const FP32_TOLERANCE: f64 = 1e-5;

/// Run a bundle or an ONNX model on the GPU.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec run bert.bundle --input input=ids.npy --check\n  fusec run models/mlp_block.onnx --input x=x.npy --output-dir out/"
)]
pub struct Run {
    /// A bundle from `fusec compile`, or an ONNX model (compiled first, shapes from the inputs).
    model: PathBuf,
    /// An input: NAME=FILE, with FILE a .npy or an ONNX TensorProto .pb.
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// Write each output as OUTPUT_NAME.npy into this directory.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Compare every output with tract running the ONNX model on the CPU.
    #[arg(long)]
    check: bool,
    /// The GPU to run on.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

fn read_inputs(specs: &[String]) -> anyhow::Result<Vec<(String, Tensor)>> {
    specs
        .iter()
        .map(|s| {
            let (name, file) =
                s.split_once('=').with_context(|| format!("--input '{s}' is not NAME=FILE"))?;
            Ok((name.to_string(), read_tensor(Path::new(file))?))
        })
        .collect()
}

impl Run {
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        let inputs = read_inputs(&self.inputs)?;
        let is_onnx = self.model.extension().is_some_and(|e| e == "onnx");
        let bundle = if is_onnx {
            let specs = inputs
                .iter()
                .map(|(name, t)| InputSpec {
                    name: name.clone(),
                    shape: t.shape().to_vec(),
                    dtype: Some(t.dtype()),
                })
                .collect();
            let options = CompileOptions {
                import: fusec::import::ImportOptions::new(specs, vec![]),
                ..Default::default()
            };
            fusec::compile(&self.model, &options)?
        } else {
            Bundle::load(&self.model)?
        };
        let mut session = fusec::runtime::Session::new(&bundle, self.device)?;
        let outputs = session.run(&inputs)?;
        if let Some(dir) = &self.output_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, t) in &outputs {
                let file: String =
                    name.chars().map(|c| if c.is_alphanumeric() || c == '_' { c } else { '_' }).collect();
                write_npy(&dir.join(format!("{file}.npy")), t)?;
            }
        }
        for (name, t) in &outputs {
            println!("output {name}: {}{:?}", t.dtype(), t.shape());
        }
        if !self.check {
            return Ok(ExitCode::SUCCESS);
        }
        let onnx = PathBuf::from(&bundle.header.model);
        let ordered: Vec<Tensor> = bundle
            .header
            .inputs
            .iter()
            .map(|spec| inputs.iter().find(|(n, _)| *n == spec.name).map(|(_, t)| t.clone()))
            .collect::<Option<_>>()
            .context("an input is missing")?;
        let reference = run_tract(&onnx, &ordered).map_err(anyhow::Error::msg)?;
        let mut failed = 0;
        for ((name, ours), theirs) in outputs.iter().zip(&reference) {
            let err = rel_l2(ours, theirs);
            let pass = err <= FP32_TOLERANCE;
            failed += usize::from(!pass);
            println!(
                "check {name}: max-abs {:.3e}, rel-L2 {err:.3e} (tolerance {FP32_TOLERANCE:e}): {}",
                max_abs_diff(ours, theirs),
                if pass { "pass" } else { "FAIL" }
            );
        }
        if failed > 0 {
            bail!("{failed} output(s) differ from the CPU reference");
        }
        Ok(ExitCode::SUCCESS)
    }
}
