//! `--input` and `--dim`, shared by every subcommand that imports a model.

use clap::Args;
use fusec::import::{DimSpec, ImportOptions, InputSpec};

#[derive(Debug, Clone, Args)]
pub struct ShapeArgs {
    /// Concrete shape (and optionally type) of an input: NAME:DIMxDIM[:TYPE], e.g.
    /// input_ids:8x128:i64. Repeat for several inputs.
    #[arg(long = "input", value_name = "NAME:SHAPE[:TYPE]")]
    pub inputs: Vec<InputSpec>,
    /// Value of a symbolic dimension of the model's inputs, e.g. --dim batch=8 --dim seq=128.
    #[arg(long = "dim", value_name = "NAME=N")]
    pub dims: Vec<DimSpec>,
}

impl ShapeArgs {
    pub fn options(&self) -> ImportOptions {
        ImportOptions::new(self.inputs.clone(), self.dims.clone())
    }
}
