//! The cost model extraction minimises, in bytes of device-memory (HBM) traffic.
//!
//! A node that runs as its own kernel costs the bytes it writes plus a fixed launch cost;
//! reading inputs is charged to their producers' writes (every written byte is read about
//! once). `LAUNCH_BYTES` prices a launch at the traffic the GPU could move in its overhead:
//! about 2 µs at 3 TB/s. Layout-only ops cost nothing (they become views or strides);
//! pattern-only nodes cost infinity, so extraction never picks them.
//!
//! Matrix products also cost their arithmetic, as the bytes the GPU could have moved in the
//! time it takes at the rate measured for its kind and precision (H100, 2026-11-23): this is
//! what chooses, per shape, between the attention kernel and GEMM + softmax + GEMM. In half
//! types the tensor-core attention kernel wins everywhere measured; in f32 its CUDA-core
//! arithmetic (about 8 TFLOP/s) loses to cuBLAS's batched GEMMs once the problem is large
//! (BERT-base at 8×128: 48 µs per layer against 37 µs for the GEMMs, softmax and copies).

use egg::{CostFunction, Id, Language};

use super::analysis::FusionGraph;
use super::lang::FusionLang;
use crate::ir::{DType, Op};

/// One kernel launch, priced in bytes of HBM traffic.
pub const LAUNCH_BYTES: f64 = 6.0e6;

/// HBM bandwidth the prices assume, bytes per second.
const BANDWIDTH: f64 = 3.0e12;

/// Rates of the matrix products, FLOP/s: (f32, half types).
const GEMM_RATE: (f64, f64) = (25.0e12, 300.0e12);
const ATTENTION_RATE: (f64, f64) = (8.0e12, 45.0e12);

pub struct HbmCost<'a> {
    pub egraph: &'a FusionGraph,
    /// The precision the graph runs in.
    pub precision: DType,
}

impl HbmCost<'_> {
    fn written_bytes(&self, node: &FusionLang) -> Option<f64> {
        let class = self.egraph.lookup(node.clone())?;
        let ty = self.egraph[class].data.ty.as_ref()?;
        Some(ty.size_bytes() as f64)
    }

    /// Floating-point operations of a matrix product (a multiply-add is two), else 0.
    fn flops(&self, node: &FusionLang) -> f64 {
        use FusionLang as L;
        let ty = |id: Id| self.egraph[id].data.ty.as_ref();
        let out = || self.egraph.lookup(node.clone()).and_then(ty);
        match node {
            L::MatMul([a, _]) => match (out(), ty(*a).and_then(|t| t.shape.last())) {
                (Some(out), Some(&k)) => 2.0 * out.len() as f64 * k as f64,
                _ => 0.0,
            },
            L::Attention([q, kt, ..]) | L::AttentionNanToZero([q, kt, ..]) => {
                match (out(), ty(*q), ty(*kt).and_then(|t| t.shape.last())) {
                    (Some(out), Some(q), Some(&keys)) => 2.0 * (q.len() + out.len()) as f64 * keys as f64,
                    _ => 0.0,
                }
            }
            _ => 0.0,
        }
    }

    /// The arithmetic of `node`, in bytes moved in the same time.
    fn compute_bytes(&self, node: &FusionLang) -> f64 {
        let flops = self.flops(node);
        if flops == 0.0 {
            return 0.0;
        }
        let (f32_rate, half_rate) = match node {
            FusionLang::MatMul(_) => GEMM_RATE,
            _ => ATTENTION_RATE,
        };
        let rate = if self.precision == DType::F32 { f32_rate } else { half_rate };
        flops / rate * BANDWIDTH
    }

    fn own_cost(&self, node: &FusionLang) -> f64 {
        use FusionLang as L;
        match node {
            L::Const(_) | L::Input(_) | L::Absent | L::Perm(_) => 0.0,
            L::Variance(_) | L::SoftmaxNanToZero(_) => f64::INFINITY,
            L::Transpose(_) => 1.0,
            L::Other(op, _) if matches!(self.egraph.analysis.op(*op), Op::Reshape { .. }) => 0.0,
            _ => match self.written_bytes(node) {
                Some(bytes) => bytes + LAUNCH_BYTES + self.compute_bytes(node),
                None => f64::INFINITY,
            },
        }
    }
}

impl CostFunction<FusionLang> for HbmCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &FusionLang, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        enode.children().iter().fold(self.own_cost(enode), |sum, &c| sum + costs(c))
    }
}
