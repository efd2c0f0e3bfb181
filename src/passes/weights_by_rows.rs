//! A MatMul's constant weights `[K, N]` whose rows cannot be read in 16-byte packs (N not a
//! multiple of 8 elements: GPT-2's vocabulary projection is 50,257 wide, so each of its rows
//! starts at an odd element) stored transposed, `[N, K]`, behind a `Transpose` that the GEMM
//! reads as its operand's layout (no kernel, no copy). cuBLAS reads either layout; fusec's
//! kernels for a few rows need whole packs along the stored rows, which `[N, K]` gives
//! whatever N is.

use super::{Pass, SharedConstants};
use crate::ir::ops::layout;
use crate::ir::{Graph, IrError, Op, Origin};

/// Stores the odd-width constant weights of MatMuls transposed (read through a `Transpose`).
/// The transposes are made through the shared constants where given: the same weights at
/// several sizes are held once.
#[derive(Default)]
pub struct WeightsByRows<'s> {
    shared: Option<&'s SharedConstants>,
}

impl<'s> WeightsByRows<'s> {
    /// The pass, its transposes made through `shared` where given.
    pub fn sharing(shared: Option<&'s SharedConstants>) -> Self {
        WeightsByRows { shared }
    }
}

/// Elements of the narrowest type a pack holds: N must be a multiple for rows of `[K, N]` to
/// start on a pack.
const PACK: usize = 8;

impl Pass for WeightsByRows<'_> {
    fn name(&self) -> &'static str {
        "weights-by-rows"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        // `FUSEC_WEIGHTS_BY_ROWS=0` leaves the weights as the model stores them, for measuring.
        if crate::knobs::off("FUSEC_WEIGHTS_BY_ROWS") {
            return Ok(0);
        }
        let mut changed = 0;
        for id in graph.topo_order()? {
            let Some(weight) = graph.constant(id).cloned() else { continue };
            let users = graph.users_of(id);
            let &[k, n] = weight.shape() else { continue };
            // Every user a MatMul reading it as its right operand only.
            let only_weights = !users.is_empty()
                && users.iter().all(|&u| {
                    let inputs = graph.inputs_of(u);
                    graph.node(u).op == Op::MatMul && inputs[0] != id && inputs[1] == id
                });
            if !only_weights || n % PACK == 0 || k < 2 || n < 2 {
                continue;
            }
            let node = graph.node(id);
            let (name, origin) = (node.name.clone(), node.origin.clone());
            let fail =
                |message: String| IrError::Op { node: origin.node.clone(), op: "MatMul".into(), message };
            let transposed = SharedConstants::derive_or_make(self.shared, "transpose", &[&weight], || {
                layout::eval_transpose(&weight, &[1, 0])
            })
            .map_err(|e| fail(e.to_string()))?;
            let by_rows = graph.add_constant(&format!("{name}_by_rows"), transposed, origin.clone());
            let view = graph.add_op(
                Op::Transpose { perm: vec![1, 0] },
                &[by_rows],
                &format!("{name}_read_by_rows"),
                Origin::new(origin.node.clone(), "Transpose"),
            )?;
            graph.replace_uses(id, view);
            graph.remove_node(id);
            changed += 1;
        }
        Ok(changed)
    }
}
