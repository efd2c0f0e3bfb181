//! A half-type product whose only reader widens it to f32 (a decoder's f32 logits under
//! `--precision fp16`): the GEMM stores f32 itself, one launch and one pass over the result
//! fewer (`codegen::gemm`, [`crate::codegen::GemmSpec::out`]).

use super::{Builder, KernelKind};
use crate::ir::{DType, NodeId, Op};
use crate::knobs;

/// The epilogue step of a GEMM kernel that takes in the cast of its product to f32 (its only
/// step: nothing follows it in the kernel).
pub(super) const WIDENED: &str = "f32";

impl KernelKind {
    /// Whether this is a GEMM whose kernel stores its half-type product as f32 itself (its
    /// epilogue the cast alone, which the partition gives only a plain half-type product).
    pub fn widens(&self) -> bool {
        matches!(self, KernelKind::Gemm { epilogue } if epilogue.len() == 1 && epilogue[0] == WIDENED)
    }
}

impl Builder<'_> {
    /// Whether `cast` (the single reader of `tail`, the product `gemm` or a reshape of it)
    /// widens a half-type product to f32 that the GEMM can store as f32 itself: a plain
    /// product (no ONNX Gemm `C`, no epilogue before the cast). `FUSEC_GEMM_WIDENS=0` keeps
    /// the cast a kernel of its own, for measuring it.
    pub(super) fn widens_product(&self, gemm: NodeId, tail: NodeId, cast: NodeId) -> bool {
        let graph = self.graph;
        let Op::Cast { to: DType::F32 } = graph.node(cast).op else { return false };
        let half = matches!(graph.node(tail).ty.dtype, DType::F16 | DType::BF16);
        let plain = match graph.node(gemm).op {
            Op::Gemm { beta, .. } => beta == 0.0 || graph.inputs_of(gemm).len() < 3,
            Op::MatMul => true,
            _ => false,
        };
        half && plain && !knobs::off("FUSEC_GEMM_WIDENS")
    }
}
