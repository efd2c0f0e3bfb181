//! A norm's scale and shift folded into the products that read it, in a half-type program.
//!
//! `LayerNorm(x; γ, β)·W + b = rstd(x)·(x − mean(x))·(γ·W) + (β·W + b)`. With `W' = γ·W`
//! centred (each column's mean over K taken out), `(x − mean)·W' = x·W'`, so the product needs
//! only x and its reciprocal deviation, not its mean: the LayerNorm becomes an RMSNorm of the
//! deviations (`Op::RmsNorm`'s `deviation`) with no scale or shift, the weights `W'`, the bias
//! `β·W + b`. An RMSNorm's scale goes into the weights alone (`W' = γ·W`). Then a kernel for a
//! few rows can take the norm in folded without reading a scale beside A or giving rows of A to
//! the scale's products (`codegen::skinny::mma`), and the norm's own kernel, where it stays,
//! computes `x·rstd` and nothing more.
//!
//! Only where every reader of the norm is such a product (through reshapes that keep the last
//! axis), each with constant weights `[K, N]` (or `[N, K]` read transposed) read by nothing
//! else, and a constant bias of N where the shift needs one. The weights are rounded to their
//! type once more (a half type's rounding of `γ·W` rather than of `W`). Compilation runs it for
//! half types unless told not to (`CompileOptions::fold_norm_scales`, `FUSEC_FOLD_NORMS=0`).

use std::sync::Arc;

use ndarray::{Array2, Ix2};

use super::{Pass, SharedConstants};
use crate::ir::{BinaryOp, Graph, IrError, NodeId, Op, Tensor};

/// Folds norms' scales and shifts into the products after them.
#[derive(Default)]
pub struct FoldNormScales<'s> {
    shared: Option<&'s SharedConstants>,
}

impl<'s> FoldNormScales<'s> {
    /// The pass, its new weights made through `shared` where given.
    pub fn sharing(shared: Option<&'s SharedConstants>) -> Self {
        FoldNormScales { shared }
    }
}

/// A product reading the norm: its node, its weights (and whether stored `[N, K]`), its bias's
/// node and input slot where it has one, and the factor its bias is added with.
struct Product {
    node: NodeId,
    weights: NodeId,
    transposed: bool,
    bias: Option<(NodeId, usize)>,
    /// `α / β` of a `Gemm` (1 for a MatMul's Add): the shift's products join C scaled so.
    bias_scale: f64,
}

impl Pass for FoldNormScales<'_> {
    fn name(&self) -> &'static str {
        "fold-norm-scales"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut folded = 0;
        for id in graph.topo_order()? {
            let (axis, epsilon, centred) = match graph.node(id).op {
                Op::LayerNorm { axis, epsilon } => (axis, epsilon, true),
                Op::RmsNorm { axis, epsilon, deviation: false } => (axis, epsilon, false),
                _ => continue,
            };
            let inputs = graph.inputs_of(id);
            let k = *graph.node(id).ty.shape.last().unwrap_or(&0);
            // Input `slot` where it is a constant of K elements.
            let vector = |slot: usize| graph.constant(*inputs.get(slot)?).filter(|v| v.len() == k).cloned();
            let Some(scale) = vector(1) else { continue };
            let gamma = scale.to_f64_vec();
            // The shift and its values, where they are not all zeros.
            let beta = match inputs.get(2) {
                Some(_) => match vector(2) {
                    Some(b) => {
                        let values = b.to_f64_vec();
                        values.iter().any(|&v| v != 0.0).then_some((b, values))
                    }
                    None => continue,
                },
                None => None,
            };
            let is_output = graph.outputs().iter().any(|(_, o)| *o == id);
            if axis + 1 != graph.node(id).ty.rank() || k == 0 || is_output {
                continue;
            }
            let Some(products) = products_of(graph, id, k, beta.is_some()) else { continue };
            for p in &products {
                let beta = beta.as_ref().map(|(b, values)| (b, values.as_slice()));
                self.fold(graph, p, (&scale, &gamma), beta, centred)?;
            }
            graph.node_mut(id).op = Op::RmsNorm { axis, epsilon, deviation: centred };
            graph.keep_inputs(id, 1);
            for &dropped in &inputs[1..] {
                if graph.users_of(dropped).is_empty() {
                    graph.remove_node(dropped);
                }
            }
            folded += 1;
        }
        Ok(folded)
    }
}

impl FoldNormScales<'_> {
    /// Product `p`'s weights scaled by the norm's scale (`scale`, its values `gamma`) down K
    /// (and centred), its bias gaining the shift's products (`beta`: the shift and its values).
    /// Both made through the shared constants where given: a range's sizes make them once.
    fn fold(
        &self,
        graph: &mut Graph,
        p: &Product,
        (scale, gamma): (&Arc<Tensor>, &[f64]),
        beta: Option<(&Arc<Tensor>, &[f64])>,
        centred: bool,
    ) -> Result<(), IrError> {
        let node = graph.node(p.node).clone();
        let fail =
            |message: String| IrError::Op { node: node.origin.node.clone(), op: node.op.kind(), message };
        let w = graph.constant(p.weights).cloned().ok_or_else(|| fail("weights not constant".into()))?;
        let what = format!("fold norm scale (centred {centred}, transposed {})", p.transposed);
        let scaled = SharedConstants::derive_or_make(self.shared, &what, &[&w, scale], || {
            scaled_weights(&w, gamma, p.transposed, centred)
        })
        .map_err(fail)?;
        let origin = graph.node(p.weights).origin.clone();
        let name = format!("{}_norm_folded", graph.node(p.weights).name);
        let new_w = graph.add_constant(&name, scaled, origin);
        graph.set_input(p.node, 1, new_w);
        if graph.users_of(p.weights).is_empty() {
            graph.remove_node(p.weights);
        }
        let (Some((shift, beta)), Some((holder, slot))) = (beta, p.bias) else { return Ok(()) };
        let old = graph.inputs_of(holder)[slot];
        let bias = graph.constant(old).cloned().ok_or_else(|| fail("bias not constant".into()))?;
        let what = format!("fold norm shift (transposed {}, scaled {:e})", p.transposed, p.bias_scale);
        let new_bias = SharedConstants::derive_or_make(self.shared, &what, &[&bias, &w, shift], || {
            let products = shift_products(&w, beta, p.transposed)?;
            let mut values = bias.to_f64();
            for (v, s) in values.iter_mut().zip(products.iter().cycle()) {
                *v += p.bias_scale * s;
            }
            Ok::<_, String>(Tensor::from_f64(values, bias.dtype()))
        })
        .map_err(fail)?;
        let origin = graph.node(old).origin.clone();
        let name = format!("{}_norm_folded", graph.node(old).name);
        let new_b = graph.add_constant(&name, new_bias, origin);
        graph.set_input(holder, slot, new_b);
        if graph.users_of(old).is_empty() {
            graph.remove_node(old);
        }
        Ok(())
    }
}

/// `w` (`[K, N]`, or `[N, K]` where `transposed`) as `[K, N]` f64 values.
fn as_k_by_n(w: &Tensor, transposed: bool) -> Result<Array2<f64>, String> {
    let values = w.to_f64().into_dimensionality::<Ix2>().map_err(|e| e.to_string())?;
    Ok(if transposed { values.reversed_axes() } else { values })
}

/// `γ·W` down K, each column's mean taken out where `centred`, in `w`'s type and layout.
fn scaled_weights(w: &Tensor, gamma: &[f64], transposed: bool, centred: bool) -> Result<Tensor, String> {
    let mut values = as_k_by_n(w, transposed)?.as_standard_layout().into_owned();
    for (mut row, g) in values.rows_mut().into_iter().zip(gamma) {
        row.mapv_inplace(|v| v * g);
    }
    if centred {
        let means = values.mean_axis(ndarray::Axis(0)).ok_or("weights without rows")?;
        for mut row in values.rows_mut() {
            row -= &means;
        }
    }
    let stored = if transposed { values.reversed_axes() } else { values };
    Ok(Tensor::from_f64(stored.as_standard_layout().into_owned().into_dyn(), w.dtype()))
}

/// `β·W`: the shift's product with each column of the original weights.
fn shift_products(w: &Tensor, beta: &[f64], transposed: bool) -> Result<Vec<f64>, String> {
    let values = as_k_by_n(w, transposed)?;
    Ok(values.columns().into_iter().map(|c| c.iter().zip(beta).map(|(w, b)| w * b).sum()).collect())
}

/// Every reader of norm `norm` (K wide) as a product it can be folded into, or None where one
/// is not; each with a bias where `needs_bias`.
fn products_of(graph: &Graph, norm: NodeId, k: usize, needs_bias: bool) -> Option<Vec<Product>> {
    let mut products = Vec::new();
    let mut stack = graph.users_of(norm);
    let mut from = vec![norm; stack.len()];
    while let Some(u) = stack.pop() {
        let input = from.pop()?;
        let node = graph.node(u);
        let inputs = graph.inputs_of(u);
        match &node.op {
            // A reshape that keeps the last axis: its readers read the norm too.
            Op::Reshape { .. } | Op::Identity if node.ty.shape.last() == Some(&k) => {
                if graph.outputs().iter().any(|(_, o)| *o == u) {
                    return None;
                }
                for r in graph.users_of(u) {
                    stack.push(r);
                    from.push(u);
                }
            }
            Op::MatMul if inputs.len() == 2 && inputs[0] == input && inputs[1] != input => {
                let weights = weights_of(graph, inputs[1], k, false)?;
                let bias = match graph.users_of(u)[..] {
                    [add] if matches!(graph.node(add).op, Op::Binary(BinaryOp::Add)) => {
                        let a = graph.inputs_of(add);
                        let n = *node.ty.shape.last()?;
                        let slot = a.iter().position(|&i| i != u)?;
                        let row = graph.constant(a[slot]).is_some_and(|c| {
                            c.len() == n && c.shape().last() == Some(&n) && graph.users_of(a[slot]) == [add]
                        });
                        row.then_some((add, slot))
                    }
                    _ => None,
                };
                if needs_bias && bias.is_none() {
                    return None;
                }
                products.push(Product { node: u, weights, transposed: false, bias, bias_scale: 1.0 });
            }
            Op::Gemm { alpha, beta, trans_a: false, trans_b } if inputs[0] == input && inputs[1] != input => {
                let weights = weights_of(graph, inputs[1], k, *trans_b)?;
                let n = *node.ty.shape.last()?;
                let bias = inputs.get(2).filter(|&&c| {
                    graph.constant(c).is_some_and(|t| t.len() == n && t.shape().last() == Some(&n))
                        && graph.users_of(c) == [u]
                });
                if needs_bias && (bias.is_none() || *beta == 0.0) {
                    return None;
                }
                let bias_scale = if *beta == 0.0 { 0.0 } else { f64::from(*alpha) / f64::from(*beta) };
                products.push(Product {
                    node: u,
                    weights,
                    transposed: *trans_b,
                    bias: bias.map(|_| (u, 2)),
                    bias_scale,
                });
            }
            _ => return None,
        }
    }
    (!products.is_empty()).then_some(products)
}

/// `w` where it is constant weights of K rows (`[K, N]`, or `[N, K]` where `transposed`)
/// read by one node alone.
fn weights_of(graph: &Graph, w: NodeId, k: usize, transposed: bool) -> Option<NodeId> {
    let t = graph.constant(w)?;
    let rows = if transposed { t.shape().last() } else { t.shape().first() };
    (t.shape().len() == 2 && rows == Some(&k) && graph.users_of(w).len() == 1).then_some(w)
}

#[cfg(test)]
mod tests {
    use ndarray::ArrayD;

    use super::*;

    #[test]
    fn centred_weights_sum_to_nothing_down_k_and_keep_the_scale() {
        let w = Tensor::from_f64(
            ArrayD::from_shape_vec(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 7.0]).unwrap(),
            crate::ir::DType::F32,
        );
        let gamma = [2.0, 1.0, 0.5];
        let plain = scaled_weights(&w, &gamma, false, false).unwrap().to_f64_vec();
        assert_eq!(plain, vec![2.0, 4.0, 3.0, 4.0, 2.5, 3.5]);
        let centred = scaled_weights(&w, &gamma, false, true).unwrap().to_f64();
        for column in centred.columns() {
            assert!(column.sum().abs() < 1e-6, "{column}");
        }
        // Stored [N, K]: the same values, transposed.
        let t = Tensor::from_f64(
            w.to_f64().reversed_axes().as_standard_layout().into_owned(),
            crate::ir::DType::F32,
        );
        let centred_t = scaled_weights(&t, &gamma, true, true).unwrap().to_f64();
        assert_eq!(centred_t.reversed_axes(), centred);
        assert_eq!(shift_products(&w, &[1.0, 0.0, -1.0], false).unwrap(), vec![-4.0, -5.0]);
        assert_eq!(shift_products(&t, &[1.0, 0.0, -1.0], true).unwrap(), vec![-4.0, -5.0]);
    }
}
