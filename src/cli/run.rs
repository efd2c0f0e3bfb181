//! `fusec run`: run a bundle (or an ONNX model, compiled in memory) on the GPU.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use fusec::import::{run_tract, InputSpec};
use fusec::ir::{max_abs_diff, rel_l2, DType, Tensor};
use fusec::tensor_io::{read_tensor, write_npy};
use fusec::{Bundle, CompileOptions};

/// Relative L2 error allowed against the fp32 CPU reference: fp32 bundles, then fp16/bf16 ones.
const FP32_TOLERANCE: f64 = 1e-5;
const HALF_TOLERANCE: f64 = 1e-2;

/// Prints one output's comparison; returns 1 if it failed.
fn verdict(label: &str, detail: &str, pass: bool) -> usize {
    println!("{label}: {detail}: {}", if pass { "pass" } else { "FAIL" });
    usize::from(!pass)
}

/// Run a bundle or an ONNX model on the GPU.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  fusec run bert.bundle --input input=ids.npy --check\n  fusec run models/mlp_block.onnx --input x=x.npy --output-dir out/"
)]
pub struct Run {
    /// A bundle from `fusec compile`; an ONNX model (compiled first, shapes from the inputs);
    /// or a directory in the ONNX backend test layout (model.onnx, test_data_set_N/*.pb), whose
    /// data sets are run and compared with their expected outputs.
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
    /// The rel-L2 error --check allows. Default: 1e-5 for an fp32 bundle, 1e-2 for fp16 and
    /// bf16 (deep networks in half types may need more: rounding grows with depth).
    #[arg(long, value_name = "REL_L2", requires = "check")]
    tolerance: Option<f64>,
    /// The GPU to run on.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Run the steps one by one every time instead of replaying a CUDA graph.
    #[arg(long)]
    no_cuda_graph: bool,
    /// For a test directory: the relative tolerance of each element (numpy `allclose`).
    /// Default: the directory's tolerance.json, else 1e-3.
    #[arg(long)]
    rtol: Option<f64>,
    /// For a test directory: the absolute tolerance of each element. Default: the directory's
    /// tolerance.json, else 1e-5 × the output's largest expected magnitude.
    #[arg(long)]
    atol: Option<f64>,
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

/// `inputs` with each floating-point tensor converted to the floating-point type `declared` names
/// for its input, where it is another (an f32 `.npy` for a bundle whose cache input is f16, an f16
/// one for an ONNX file that declares f32), with a note naming the input; anything else is left
/// for the session to refuse with the types in its message.
fn float_types_as<'a>(
    inputs: &[(String, Tensor)],
    taker: &str,
    declared: impl Fn(&str) -> Option<&'a str>,
) -> Vec<(String, Tensor)> {
    inputs
        .iter()
        .map(|(name, t)| {
            let wanted = declared(name).and_then(DType::from_name);
            match wanted {
                Some(d) if d != t.dtype() && d.is_float() && t.dtype().is_float() => {
                    eprintln!("note: input '{name}' is {}, {taker} takes {d}: converted", t.dtype());
                    (name.clone(), t.cast(d))
                }
                _ => (name.clone(), t.clone()),
            }
        })
        .collect()
}

/// Compiles an ONNX model for the shapes of `inputs`.
fn compile_for(model: &Path, inputs: &[(String, Tensor)]) -> anyhow::Result<Bundle> {
    let specs = inputs
        .iter()
        .map(|(name, t)| InputSpec { name: name.clone(), shape: t.shape().to_vec(), dtype: Some(t.dtype()) })
        .collect();
    let options =
        CompileOptions { import: fusec::import::ImportOptions::new(specs, vec![]), ..Default::default() };
    Ok(fusec::compile(model, &options)?)
}

impl Run {
    /// Runs every data set of an ONNX backend test directory against its expected outputs.
    fn run_test_directory(&self) -> anyhow::Result<ExitCode> {
        let model = self.model.join("model.onnx");
        let given = fusec::tensor_io::read_tolerance(&self.model);
        let sets = fusec::tensor_io::read_test_data_sets(&self.model)?;
        if sets.is_empty() {
            bail!("{}: no test_data_set_N directories", self.model.display());
        }
        let summary = fusec::import::summarize(&model)?;
        let mut failed = 0;
        for (n, (inputs, expected)) in sets.into_iter().enumerate() {
            let named: Vec<(String, Tensor)> =
                summary.inputs.iter().map(|i| i.name.clone()).zip(inputs).collect();
            let bundle = compile_for(&model, &named)?;
            let options =
                fusec::runtime::SessionOptions { cuda_graph: !self.no_cuda_graph, ..Default::default() };
            let outputs =
                fusec::runtime::Session::with_options(&bundle, self.device, options)?.run(&named)?;
            for ((name, ours), want) in outputs.iter().zip(&expected) {
                // tolerance.json, else a whole model's criterion; --rtol/--atol override both.
                let (rtol, atol) = given.unwrap_or_else(|| fusec::tensor_io::model_tolerance(want));
                let (rtol, atol) = (self.rtol.unwrap_or(rtol), self.atol.unwrap_or(atol));
                let pass = fusec::tensor_io::allclose(ours, want, rtol, atol);
                let mut detail =
                    format!("max-abs {:.3e} (rtol {rtol:e}, atol {atol:e})", max_abs_diff(ours, want));
                if !pass {
                    if let Some((index, x, y)) = fusec::tensor_io::worst_element(ours, want, rtol, atol) {
                        detail.push_str(&format!("; worst at {index:?}: ours {x:e}, expected {y:e}"));
                    }
                }
                failed += verdict(&format!("test_data_set_{n} {name}"), &detail, pass);
            }
        }
        if failed > 0 {
            bail!("{failed} output(s) differ from the expected outputs");
        }
        Ok(ExitCode::SUCCESS)
    }

    pub fn execute(self) -> anyhow::Result<ExitCode> {
        if self.model.is_dir() {
            return self.run_test_directory();
        }
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
        let options =
            fusec::runtime::SessionOptions { cuda_graph: !self.no_cuda_graph, ..Default::default() };
        let mut session = fusec::runtime::Session::with_options(&bundle, self.device, options)?;
        let declared =
            |name: &str| bundle.header.inputs.iter().find(|s| s.name == name).map(|s| s.dtype.as_str());
        let outputs = session.run(&float_types_as(&inputs, "the bundle", declared))?;
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
        // tract takes each input as the ONNX file declares it (a half-type bundle's cache inputs
        // are f16 where the file's are f32).
        let summary = fusec::import::summarize(&onnx)?;
        let onnx_type = |name: &str| {
            summary.inputs.iter().find(|i| i.name == name).and_then(|i| i.dtype).map(|d| d.name())
        };
        let as_declared = float_types_as(&inputs, &onnx.display().to_string(), onnx_type);
        let ordered: Vec<Tensor> = bundle
            .header
            .inputs
            .iter()
            .map(|spec| as_declared.iter().find(|(n, _)| *n == spec.name).map(|(_, t)| t.clone()))
            .collect::<Option<_>>()
            .context("an input is missing")?;
        let reference = run_tract(&onnx, &ordered).map_err(anyhow::Error::msg)?;
        let default = if bundle.header.precision == DType::F32 { FP32_TOLERANCE } else { HALF_TOLERANCE };
        let tolerance = match self.tolerance {
            Some(t) if t.is_finite() && t >= 0.0 => t,
            Some(t) => bail!("--tolerance {t}: give a rel-L2 error of 0 or more"),
            None => default,
        };
        let mut failed = 0;
        for ((name, ours), theirs) in outputs.iter().zip(&reference) {
            let err = rel_l2(ours, theirs);
            let detail = format!(
                "max-abs {:.3e}, rel-L2 {err:.3e} (tolerance {tolerance:e})",
                max_abs_diff(ours, theirs)
            );
            failed += verdict(&format!("check {name}"), &detail, err <= tolerance);
            if theirs.to_f64_vec().iter().all(|&v| v == 0.0) {
                eprintln!(
                    "warning: the reference's {name} is all zeros: the check shows only that fusec's is too (a model with zero-initialized weights?)"
                );
            }
        }
        if failed > 0 {
            let hint = match bundle.header.precision {
                DType::F32 => String::new(),
                p => format!(
                    " (a {p} build rounds every stored value: a deep network can sit past {default:e} against f32 \
                     without a fault; --tolerance sets the bound)"
                ),
            };
            bail!("{failed} output(s) differ from the CPU reference{hint}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_inputs_take_the_declared_float_type_and_others_stay() {
        let x = Tensor::F32(ndarray::ArrayD::from_shape_vec(vec![3], vec![0.1f32, -2.5, 7.0]).unwrap());
        let ids = Tensor::I64(ndarray::ArrayD::from_shape_vec(vec![2], vec![4i64, 9]).unwrap());
        let inputs =
            vec![("past".to_string(), x.clone()), ("ids".to_string(), ids.clone()), ("y".into(), x.clone())];
        // `past` is declared f16, `ids` f32 (not a float given: left for the session to refuse),
        // `y` not declared at all.
        let declared = |name: &str| match name {
            "past" => Some("f16"),
            "ids" => Some("f32"),
            _ => None,
        };
        let out = float_types_as(&inputs, "the bundle", declared);
        assert_eq!(out[0].1.dtype(), DType::F16);
        assert_eq!(out[0].1.to_f64_vec(), x.cast(DType::F16).to_f64_vec());
        assert!((out[0].1.to_f64_vec()[0] - 0.1).abs() < 1e-3, "{:?}", out[0].1.to_f64_vec());
        assert_eq!(out[1].1.dtype(), DType::I64);
        assert_eq!(out[2].1.dtype(), DType::F32);
        // Back to f32 for a file that declares f32: the values of the f16 tensor, exactly.
        let back = float_types_as(&out[..1], "model.onnx", |_| Some("f32"));
        assert_eq!(back[0].1.dtype(), DType::F32);
        assert_eq!(back[0].1.to_f64_vec(), out[0].1.to_f64_vec());
    }
}
