//! The cost model extraction minimises, in bytes of device-memory (HBM) traffic.
//!
//! A node that runs as its own kernel costs the bytes it writes plus a fixed launch cost;
//! reading inputs is charged to their producers' writes (every written byte is read about
//! once). `LAUNCH_BYTES` prices a launch at the traffic the GPU could move in its overhead:
//! about 2 µs at 3 TB/s. Layout-only ops cost nothing (they become views or strides);
//! pattern-only nodes cost infinity, so extraction never picks them.
//!
//! Attention is chosen apart, per e-class and from its shapes alone ([`attention_choices`]):
//! the kernel, or GEMM + softmax + GEMM, whichever the estimate says is faster. The choice
//! cannot be left to the sum over children that extraction minimises: a tree cost counts a
//! shared sub-graph once per use, and the two forms reach their q, k and v through different
//! e-nodes, so the sums differ by more than the attention itself. In half types the
//! tensor-core kernel wins everywhere measured; in f32 its CUDA-core arithmetic (about
//! 8 TFLOP/s) loses to cuBLAS's batched GEMMs once the problem is large (BERT-base at 8×128:
//! 48 µs per layer against 37 µs for the GEMMs, softmax and copies; H100, 2026-11-23).

use std::collections::HashMap;

use egg::{CostFunction, Id, Language};

use super::analysis::FusionGraph;
use super::lang::FusionLang;
use crate::ir::{DType, Op};

/// One kernel launch, priced in bytes of HBM traffic.
pub const LAUNCH_BYTES: f64 = 6.0e6;

/// HBM bandwidth the prices assume, bytes per second.
const BANDWIDTH: f64 = 3.0e12;

/// Rates measured on the H100 (FLOP/s), f32 and half types: cuBLAS's batched GEMMs of
/// attention's shapes, and the attention kernel. Half types: BERT-base's 32×512 score and
/// value products (512×512×64 and 512×64×512, 384 of each) ran at 131–135 TFLOP/s; the
/// tensor-core kernel at about 75 TFLOP/s there (benches/NOTES.md).
const GEMM_RATE: (f64, f64) = (25.0e12, 135.0e12);
const ATTENTION_RATE: (f64, f64) = (8.0e12, 75.0e12);

pub struct HbmCost<'a> {
    egraph: &'a FusionGraph,
    /// For each e-class holding an attention node: whether the kernel is the faster form.
    attention: HashMap<Id, bool>,
}

/// Whether `node` is an attention kernel.
fn is_attention(node: &FusionLang) -> bool {
    matches!(node, FusionLang::Attention(_) | FusionLang::AttentionNanToZero(_))
}

/// For each e-class with an attention node, whether the attention kernel is estimated faster
/// than GEMM + softmax + GEMM for its shapes when the graph runs in `precision`.
///
/// - Kernel: its output written, one launch, its arithmetic at the attention kernel's rate.
/// - GEMMs: their arithmetic at the batched-GEMM rate, two launches; the score matrix written
///   three times (the product, scale and mask, softmax) with two launches; q, k, v and the
///   output copied into the layouts cuBLAS takes, four launches.
///
/// `forced`, where given, decides instead, in the order of the classes' ids (the choices
/// another compile of the same graph at other sizes made: a program for a range of sizes
/// decides as at the top of the range).
pub fn attention_choices(
    egraph: &FusionGraph,
    precision: DType,
    forced: Option<&[bool]>,
) -> HashMap<Id, bool> {
    let (gemm_rate, attention_rate, element) = match precision {
        DType::F32 => (GEMM_RATE.0, ATTENTION_RATE.0, 4.0),
        _ => (GEMM_RATE.1, ATTENTION_RATE.1, 2.0),
    };
    let mut choices = HashMap::new();
    let mut classes: Vec<_> = egraph.classes().collect();
    classes.sort_by_key(|c| c.id);
    for class in classes {
        let Some(out) = class.data.ty.as_ref() else { continue };
        for node in class.iter().filter(|n| is_attention(n)) {
            let ty = |i: usize| egraph[node.children()[i]].data.ty.as_ref();
            let (Some(q), Some(&keys)) = (ty(0), ty(1).and_then(|t| t.shape.last())) else { continue };
            let (q_len, out_len, keys) = (q.len() as f64, out.len() as f64, keys as f64);
            let flops = 2.0 * (q_len + out_len) * keys;
            let depth = q.shape.last().copied().unwrap_or(1).max(1) as f64;
            let scores = q_len / depth * keys * element;
            let kernel = out_len * element + LAUNCH_BYTES + flops / attention_rate * BANDWIDTH;
            let gemms = flops / gemm_rate * BANDWIDTH
                + 3.0 * scores
                + 2.0 * (q_len + out_len) * element
                + 8.0 * LAUNCH_BYTES;
            let forced = forced.and_then(|f| f.get(choices.len()).copied());
            choices.insert(class.id, forced.unwrap_or(kernel <= gemms));
            break;
        }
    }
    choices
}

impl<'a> HbmCost<'a> {
    pub fn new(egraph: &'a FusionGraph, precision: DType, forced: Option<&[bool]>) -> Self {
        HbmCost { egraph, attention: attention_choices(egraph, precision, forced) }
    }

    /// The attention choices, in the order of their classes' ids.
    pub fn attention_in_order(&self) -> Vec<bool> {
        let mut choices: Vec<(Id, bool)> = self.attention.iter().map(|(&id, &k)| (id, k)).collect();
        choices.sort_by_key(|&(id, _)| id);
        choices.into_iter().map(|(_, k)| k).collect()
    }

    fn own_cost(&self, node: &FusionLang) -> f64 {
        use FusionLang as L;
        let class = self.egraph.lookup(node.clone());
        // In a class with an attention node, only the chosen form can be extracted.
        if let Some(&kernel) = class.and_then(|c| self.attention.get(&self.egraph.find(c))) {
            if kernel != is_attention(node) {
                return f64::INFINITY;
            }
        }
        match node {
            L::Const(_) | L::Input(_) | L::Absent | L::Perm(_) => 0.0,
            L::Variance(_) | L::SoftmaxNanToZero(_) => f64::INFINITY,
            L::Transpose(_) => 1.0,
            L::Other(op, _) if matches!(self.egraph.analysis.op(*op), Op::Reshape { .. }) => 0.0,
            _ => match class.and_then(|c| self.egraph[c].data.ty.as_ref()) {
                Some(ty) => ty.size_bytes() as f64 + LAUNCH_BYTES,
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
