//! The independent CPU reference: tract runs the original ONNX file (its own importer, its
//! own optimiser) on concrete inputs. Tests and `fusec run --check` compare against it.

use std::path::Path;

use tract_onnx::prelude::*;

use super::tensor::from_tract;
use crate::ir::Tensor as IrTensor;

fn to_tract(t: &IrTensor) -> Tensor {
    match t {
        IrTensor::F32(a) => a.clone().into_tensor(),
        IrTensor::F16(a) => a.clone().into_tensor(),
        // tract has no bf16: run bf16 inputs in f32.
        IrTensor::BF16(a) => a.mapv(f32::from).into_tensor(),
        IrTensor::F64(a) => a.clone().into_tensor(),
        IrTensor::I64(a) => a.clone().into_tensor(),
        IrTensor::I32(a) => a.clone().into_tensor(),
        IrTensor::Bool(a) => a.clone().into_tensor(),
    }
}

thread_local! {
    static IN_REFERENCE_RUN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is inside tract's run of [`run_tract`], where a panic becomes
/// [`run_tract`]'s error: the `fusec` command's panic hook prints nothing for such a panic
/// (a library leaves its caller's hook alone).
pub fn in_reference_run() -> bool {
    IN_REFERENCE_RUN.with(std::cell::Cell::get)
}

/// Marks the thread as inside tract's run while it lives.
struct InReferenceRun(bool);

impl InReferenceRun {
    fn during<T>(run: impl FnOnce() -> T) -> T {
        let _mark = InReferenceRun(IN_REFERENCE_RUN.with(|c| c.replace(true)));
        run()
    }
}

impl Drop for InReferenceRun {
    fn drop(&mut self) {
        IN_REFERENCE_RUN.with(|c| c.set(self.0));
    }
}

/// Runs the ONNX model at `path` with tract on `inputs` (in the model's input order) and
/// returns its outputs in order.
pub fn run_tract(path: &Path, inputs: &[IrTensor]) -> Result<Vec<IrTensor>, String> {
    TractPlan::new(path, inputs)?.run(inputs)
}

/// The ONNX model at a path, optimised by tract for inputs of one set of types and shapes:
/// run again and again without importing it again (a decoding loop's steps on the CPU).
pub struct TractPlan {
    path: std::path::PathBuf,
    plan: Arc<TypedRunnableModel>,
}

impl TractPlan {
    /// The model at `path` for inputs of the types and shapes of `inputs` (in its input order).
    pub fn new(path: &Path, inputs: &[IrTensor]) -> Result<Self, String> {
        let context = |e: TractError| format!("tract on {}: {e:#}", path.display());
        // Exporters annotate intermediate values with symbolic shapes; with concrete inputs tract
        // must infer them instead of unifying with the annotations.
        let onnx = tract_onnx::onnx().with_ignore_value_info(true).with_ignore_output_shapes(true);
        let mut model = onnx.model_for_path(path).map_err(context)?;
        for (i, t) in inputs.iter().enumerate() {
            let t = to_tract(t);
            model.set_input_fact(i, InferenceFact::dt_shape(t.datum_type(), t.shape())).map_err(context)?;
        }
        let plan = model.into_optimized().map_err(context)?.into_runnable().map_err(context)?;
        Ok(TractPlan { path: path.to_path_buf(), plan })
    }

    /// Runs it on `inputs` (the types and shapes it was made for) and returns the outputs in order.
    pub fn run(&self, inputs: &[IrTensor]) -> Result<Vec<IrTensor>, String> {
        let path = &self.path;
        let context = |e: TractError| format!("tract on {}: {e:#}", path.display());
        let feeds: TVec<TValue> = inputs.iter().map(|t| to_tract(t).into_tvalue()).collect();
        // tract panics on some inputs (an index past a Gather's table, a negative one in GatherND):
        // an error, not a crash. While it runs, `in_reference_run` says so, for a program's panic
        // hook to leave the message to that error.
        let plan = &self.plan;
        let outputs = InReferenceRun::during(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plan.run(feeds)))
        })
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            format!("tract on {} failed on these inputs: it panicked ({what})", path.display())
        })?
        .map_err(context)?;
        outputs.iter().map(|t| from_tract(t)).collect()
    }
}

/// Each output's dims that tract infers to be fixed for any value of the inputs' symbolic
/// dims (`None` for the others), as ONNX Runtime reports them: a model's metadata beyond
/// what the file declares.
pub fn fixed_output_dims(path: &Path) -> Result<Vec<Vec<Option<usize>>>, String> {
    let context = |e: TractError| format!("tract on {}: {e:#}", path.display());
    let onnx = tract_onnx::onnx().with_ignore_value_info(true).with_ignore_output_shapes(true);
    let model = onnx.model_for_path(path).map_err(context)?.into_typed().map_err(context)?;
    model
        .output_outlets()
        .map_err(context)?
        .iter()
        .map(|&outlet| {
            let fact = model.outlet_fact(outlet).map_err(context)?;
            Ok(fact.shape.iter().map(|d| d.to_i64().ok().and_then(|n| usize::try_from(n).ok())).collect())
        })
        .collect()
}
