//! A key/value cache updated in place. Decoders exported with their cache compute each
//! `present` output as `Concat(past, new)` along the sequence axis, `past` a graph input: run
//! as written, every step copies the whole cache into `present`. This pass turns each such
//! concatenation into an [`Op::Append`]: the plan stores `past` inside `present`'s buffer (the
//! first slots of every row), so the step writes only the new positions. In a half build the
//! cache keeps the storage type at the graph's boundary (the casts of `past` in and of
//! `present` out are dropped): a step neither converts nor copies it.
//!
//! The graph's values are unchanged; what changes is its boundary: `past` and `present` in
//! the storage type, and `past` laid out inside `present` (`plan::Inside`).

use super::Pass;
use crate::ir::{Graph, IrError, NodeId, Op};

/// The pass: every graph output that is `Concat(past, new)` (through a cast each way, in half
/// builds) of a graph input `past` read by nothing else becomes an [`Op::Append`].
pub struct CacheInPlace;

impl Pass for CacheInPlace {
    fn name(&self) -> &'static str {
        "cache-in-place"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        // Identities (a `Concat` of one input between `past` and the concatenation) and nodes
        // nothing reads, left in an unfused graph (which runs no other pass), do not count as
        // readers of the cache.
        let mut changed = super::RemoveNoops.run(graph)? + graph.remove_unused();
        let outputs = graph.outputs().to_vec();
        let mut new_outputs = outputs.clone();
        for (k, (_, out)) in outputs.iter().enumerate() {
            let Some(found) = find(graph, *out) else { continue };
            let Op::Concat { axis } = graph.node(found.concat).op else { continue };
            let dtype = graph.node(found.concat).ty.dtype;
            graph.node_mut(found.past).ty.dtype = dtype;
            graph.set_input(found.concat, 0, found.past);
            graph.node_mut(found.concat).op = Op::Append { axis };
            new_outputs[k].1 = found.concat;
            changed += 1;
        }
        graph.set_outputs(new_outputs);
        changed += graph.remove_unused();
        Ok(changed)
    }
}

/// A `present = Concat(past, new)` found: the concatenation and the graph input.
struct Found {
    concat: NodeId,
    past: NodeId,
}

/// The concatenation behind graph output `out` and its `past` input, where the pattern holds:
/// `out` is the concatenation or a cast of it read by nothing else; its first of two inputs
/// is the graph input or a cast of it; the input is read by nothing else; the input and the
/// output are of one type, the input's shape `out`'s but along the axis.
fn find(graph: &Graph, out: NodeId) -> Option<Found> {
    let only_user = |id: NodeId, user: NodeId| graph.users_of(id) == [user];
    let (concat, out_cast) = match graph.node(out).op {
        Op::Concat { .. } => (out, None),
        Op::Cast { .. } => {
            let c = graph.inputs_of(out)[0];
            (matches!(graph.node(c).op, Op::Concat { .. })).then_some((c, Some(out)))?
        }
        _ => return None,
    };
    let Op::Concat { axis } = graph.node(concat).op else { return None };
    let [first, _new] = graph.inputs_of(concat)[..] else { return None };
    let (past, in_cast) = match graph.node(first).op {
        Op::Input { .. } => (first, None),
        Op::Cast { .. } => (graph.inputs_of(first)[0], Some(first)),
        _ => return None,
    };
    if !matches!(graph.node(past).op, Op::Input { .. })
        || graph.outputs().iter().filter(|(_, o)| *o == out).count() != 1
    {
        return None;
    }
    // Nothing else reads the input (or its cast), and the boundary types agree.
    match in_cast {
        Some(cast) if !only_user(past, cast) || !only_user(cast, concat) => return None,
        None if !only_user(past, concat) => return None,
        _ => {}
    }
    if let Some(cast) = out_cast {
        // The cast out must be the only thing that makes `out` differ from the concatenation.
        if graph.node(cast).ty.dtype != graph.node(past).ty.dtype {
            return None;
        }
    } else if in_cast.is_some() {
        return None;
    }
    if out_cast.is_some() != in_cast.is_some() {
        return None;
    }
    let (p, c) = (&graph.node(past).ty, &graph.node(concat).ty);
    let same_off_axis = p.rank() == c.rank() && (0..p.rank()).all(|i| i == axis || p.shape[i] == c.shape[i]);
    same_off_axis.then_some(Found { concat, past })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Origin, TensorType};

    fn cache_graph(half: bool) -> Graph {
        let mut g = Graph::new();
        let past = g.add_input("past", TensorType::new(DType::F32, vec![2, 3, 5, 4]));
        let new = g.add_input("new", TensorType::new(DType::F32, vec![2, 3, 1, 4]));
        let o = |n: &str| Origin::new(n, "X");
        let (mut p, mut n) = (past, new);
        if half {
            p = g.add_op(Op::Cast { to: DType::F16 }, &[past], "p16", o("p16")).unwrap();
            n = g.add_op(Op::Cast { to: DType::F16 }, &[new], "n16", o("n16")).unwrap();
        }
        let cat = g.add_op(Op::Concat { axis: 2 }, &[p, n], "cat", o("cat")).unwrap();
        let out =
            if half { g.add_op(Op::Cast { to: DType::F32 }, &[cat], "out", o("out")).unwrap() } else { cat };
        g.set_outputs(vec![("present".into(), out)]);
        g
    }

    #[test]
    fn concat_of_an_input_becomes_an_append_in_the_storage_type() {
        for half in [false, true] {
            let mut g = cache_graph(half);
            assert!(CacheInPlace.run(&mut g).unwrap() > 0);
            let (_, out) = g.outputs()[0].clone();
            assert_eq!(g.node(out).op, Op::Append { axis: 2 });
            let past = g.inputs_of(out)[0];
            assert_eq!(g.node(past).name, "past");
            let dtype = if half { DType::F16 } else { DType::F32 };
            assert_eq!((g.node(past).ty.dtype, g.node(out).ty.dtype), (dtype, dtype));
            crate::ir::verify(&g).unwrap();
        }
    }

    #[test]
    fn a_past_read_elsewhere_is_left_alone() {
        let mut g = cache_graph(false);
        let past = g.inputs()[0];
        let other =
            g.add_op(Op::Unary(crate::ir::UnaryOp::Neg), &[past], "neg", Origin::new("neg", "Neg")).unwrap();
        let mut outputs = g.outputs().to_vec();
        outputs.push(("other".into(), other));
        g.set_outputs(outputs);
        CacheInPlace.run(&mut g).unwrap();
        assert!(matches!(g.node(g.outputs()[0].1).op, Op::Concat { .. }));
    }
}
