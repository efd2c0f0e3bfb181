//! A pooling window in an elementwise kernel: each output element loops over its window
//! (max, or a mean over the taps that count), reading the input through views.

use super::index::Coords;
use super::kernel::Body;
use crate::ir::{NodeId, PoolKind, PoolWindow, SymDim};

impl Body<'_> {
    /// The value of pooling node `id` at `coords` (n, c, oh, ow; n, oh, ow, c channels-last),
    /// as a local; the window's loop goes into the statements.
    pub(super) fn pool_loop(
        &mut self,
        id: NodeId,
        coords: &Coords,
        kind: PoolKind,
        window: &PoolWindow,
    ) -> Result<String, String> {
        let input = self.plan.graph.inputs_of(id)[0];
        let mut x: Vec<String> = self.dims(input).iter().map(SymDim::c).collect();
        let mut coords = coords.clone();
        if window.channels_last {
            // Named as NCHW; the read below puts the axes back in their order.
            (x, coords) = (super::conv::nchw_order(&x), super::conv::nchw_order(&coords));
        }
        let (acc, count, kh, kw) =
            (self.fresh("acc"), self.fresh("count"), self.fresh("kh"), self.fresh("kw"));
        let (n, c, oh, ow) = (&coords[0], &coords[1], &coords[2], &coords[3]);
        let PoolWindow { kernel, strides, pads, dilations, .. } = *window;
        let ih = format!("({oh} * {}LL + {kh} * {}LL - {}LL)", strides[0], dilations[0], pads[0]);
        let iw = format!("({ow} * {}LL + {kw} * {}LL - {}LL)", strides[1], dilations[1], pads[1]);
        let at = match window.channels_last {
            true => vec![n.clone(), ih.clone(), iw.clone(), c.clone()],
            false => vec![n.clone(), c.clone(), ih.clone(), iw.clone()],
        };
        let value = self.read(input, at)?;
        let loops = format!(
            "for (long long {kh} = 0; {kh} < {}LL; ++{kh}) for (long long {kw} = 0; {kw} < {}LL; ++{kw})",
            kernel[0], kernel[1]
        );
        let inside = format!("({ih} >= 0 && {ih} < {} && {iw} >= 0 && {iw} < {})", x[2], x[3]);
        match kind {
            PoolKind::Max => {
                self.statements.push(format!(
                    "float {acc} = -fusec::inf(); {loops} {{ if ({inside}) {acc} = fmaxf({acc}, {value}); }}"
                ));
                Ok(acc)
            }
            PoolKind::Average { count_include_pad } => {
                // Taps in the explicit padding count as zeros where the op says so; taps past
                // it (a ceil-mode window's overhang) never count.
                let counted = if count_include_pad {
                    format!(
                        "({ih} >= -{}LL && {ih} < {} + {}LL && {iw} >= -{}LL && {iw} < {} + {}LL)",
                        pads[0], x[2], pads[2], pads[1], x[3], pads[3]
                    )
                } else {
                    inside.clone()
                };
                self.statements.push(format!(
                    "float {acc} = 0.0f; float {count} = 0.0f; {loops} {{ if ({inside}) {acc} += {value}; if ({counted}) {count} += 1.0f; }}"
                ));
                Ok(format!("({acc} / {count})"))
            }
        }
    }
}
