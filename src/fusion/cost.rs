//! The cost model extraction minimises, in bytes of device-memory (HBM) traffic.
//!
//! A node that runs as its own kernel costs the bytes it writes plus a fixed launch cost;
//! reading inputs is charged to their producers' writes (every written byte is read about
//! once). `LAUNCH_BYTES` prices a launch at the traffic the GPU could move in its overhead:
//! about 2 µs at 3 TB/s. Layout-only ops cost nothing (they become views or strides);
//! pattern-only nodes cost infinity, so extraction never picks them.

use egg::{CostFunction, Id, Language};

use super::analysis::FusionGraph;
use super::lang::FusionLang;
use crate::ir::Op;

/// One kernel launch, priced in bytes of HBM traffic.
pub const LAUNCH_BYTES: f64 = 6.0e6;

pub struct HbmCost<'a> {
    pub egraph: &'a FusionGraph,
}

impl HbmCost<'_> {
    fn written_bytes(&self, node: &FusionLang) -> Option<f64> {
        let class = self.egraph.lookup(node.clone())?;
        let ty = self.egraph[class].data.ty.as_ref()?;
        Some(ty.size_bytes() as f64)
    }

    fn own_cost(&self, node: &FusionLang) -> f64 {
        use FusionLang as L;
        match node {
            L::Const(_) | L::Input(_) | L::Absent | L::Perm(_) => 0.0,
            L::Variance(_) | L::SoftmaxNanToZero(_) => f64::INFINITY,
            L::Transpose(_) => 1.0,
            L::Other(op, _) if matches!(self.egraph.analysis.op(*op), Op::Reshape { .. }) => 0.0,
            _ => match self.written_bytes(node) {
                Some(bytes) => bytes + LAUNCH_BYTES,
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
