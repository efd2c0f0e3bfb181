//! Decoding steps run by tract on the CPU: the reference a GPU generator is checked against,
//! the same loop over the same cache layout without a GPU.

use std::path::{Path, PathBuf};

use super::{GenerateError, Steps};
use crate::bundle::IoSpec;
use crate::ir::{DType, Tensor, TensorType};
use crate::runtime::RowCopy;

/// The ONNX model's steps on the CPU, its inputs and outputs held as host tensors.
pub struct TractSteps {
    path: PathBuf,
    inputs: Vec<(String, Tensor)>,
    output_names: Vec<String>,
    outputs: Vec<Tensor>,
    /// tract's plan, made at the first step (the inputs keep their types and shapes).
    plan: Option<crate::import::TractPlan>,
}

fn io_type(spec: &IoSpec) -> Result<TensorType, GenerateError> {
    spec.tensor_type()
        .ok_or_else(|| GenerateError::Layout(format!("'{}' has type {}", spec.name, spec.dtype)))
}

impl TractSteps {
    /// Steps of the model at `path` with the inputs and outputs of a bundle compiled from it
    /// (their order, types and shapes), every input zeros at first.
    pub fn new(path: &Path, inputs: &[IoSpec], outputs: &[IoSpec]) -> Result<Self, GenerateError> {
        let inputs = inputs
            .iter()
            .map(|spec| Ok((spec.name.clone(), Tensor::full(&io_type(spec)?, 0.0))))
            .collect::<Result<_, GenerateError>>()?;
        let output_names = outputs.iter().map(|o| o.name.clone()).collect();
        Ok(TractSteps { path: path.to_path_buf(), inputs, output_names, outputs: Vec::new(), plan: None })
    }

    fn input(&mut self, name: &str) -> Result<&mut Tensor, GenerateError> {
        self.inputs
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| GenerateError::Input(format!("the model has no input '{name}'")))
    }
}

impl Steps for TractSteps {
    fn write_input(&mut self, name: &str, tensor: &Tensor) -> Result<(), GenerateError> {
        let slot = self.input(name)?;
        if slot.tensor_type() != tensor.tensor_type() {
            return Err(GenerateError::Input(format!(
                "input '{name}' is {}, the tensor given {}",
                slot.tensor_type(),
                tensor.tensor_type()
            )));
        }
        *slot = tensor.clone();
        Ok(())
    }

    fn zero_input(&mut self, name: &str) -> Result<(), GenerateError> {
        let slot = self.input(name)?;
        *slot = Tensor::full(&slot.tensor_type(), 0.0);
        Ok(())
    }

    fn execute(&mut self) -> Result<(), GenerateError> {
        let values: Vec<Tensor> = self.inputs.iter().map(|(_, t)| t.clone()).collect();
        let plan = match self.plan.take() {
            Some(plan) => plan,
            None => crate::import::TractPlan::new(&self.path, &values).map_err(GenerateError::Input)?,
        };
        let outputs = plan.run(&values).map_err(GenerateError::Input);
        self.plan = Some(plan);
        self.outputs = outputs?;
        Ok(())
    }

    fn read_output(&mut self, name: &str) -> Result<Tensor, GenerateError> {
        let k = self.output_names.iter().position(|n| n == name);
        k.and_then(|k| self.outputs.get(k).cloned())
            .ok_or_else(|| GenerateError::Input(format!("no output '{name}' from the last step")))
    }

    fn copy_output_rows(&mut self, from: &str, to: &str, copy: RowCopy) -> Result<(), GenerateError> {
        let source = self.read_output(from)?;
        copy_rows(&source, self.input(to)?, from, to, copy)
    }

    fn copy_output_rows_into(
        &mut self,
        target: &mut Self,
        pairs: &[(&str, &str)],
        copy: RowCopy,
    ) -> Result<(), GenerateError> {
        for (from, to) in pairs {
            let source = self.read_output(from)?;
            copy_rows(&source, target.input(to)?, from, to, copy)?;
        }
        Ok(())
    }

    fn input_type(&self, name: &str) -> Option<DType> {
        self.inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t.dtype())
    }
}

/// Copies `copy`'s rows of bytes from `source` (output `from`) into `target` (input `to`).
fn copy_rows(
    source: &Tensor,
    target: &mut Tensor,
    from: &str,
    to: &str,
    copy: RowCopy,
) -> Result<(), GenerateError> {
    let source = source.to_le_bytes();
    let mut bytes = target.to_le_bytes();
    for r in 0..copy.rows {
        let (f, t) = (copy.from_offset + r * copy.from_pitch, copy.to_offset + r * copy.to_pitch);
        let (Some(row), true) = (source.get(f..f + copy.width), t + copy.width <= bytes.len()) else {
            return Err(GenerateError::Input(format!(
                "a copy of rows from '{from}' to '{to}' runs past one of them"
            )));
        };
        bytes[t..t + copy.width].copy_from_slice(row);
    }
    target.read_le_bytes(&bytes);
    Ok(())
}
