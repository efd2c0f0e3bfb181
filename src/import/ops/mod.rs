//! The table of supported ONNX ops: `op_type` → translator, one file per op family.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::context::{NodeCtx, Translated};

mod activations;
mod conv_transpose;
mod elementwise;
mod layout;
mod linalg;
mod rearrange;
mod reduce;
mod resize;
mod shape;
mod vision;

pub(crate) type Translate = fn(&mut NodeCtx) -> Translated;
pub(crate) type Registry = HashMap<&'static str, Translate>;

/// The translators, by ONNX `op_type` (default domain).
pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut reg = Registry::new();
        elementwise::register(&mut reg);
        linalg::register(&mut reg);
        reduce::register(&mut reg);
        layout::register(&mut reg);
        shape::register(&mut reg);
        vision::register(&mut reg);
        activations::register(&mut reg);
        rearrange::register(&mut reg);
        resize::register(&mut reg);
        conv_transpose::register(&mut reg);
        reg
    })
}

/// ONNX ops that only compute shapes; none may be left after folding.
pub const SHAPE_OPS: &[&str] = &["Shape", "Size", "ConstantOfShape", "Range"];
