//! Moves a `Slice` before the op that makes its input, where that op computes each kept
//! element from the same positions of its inputs along the sliced axes: the op then computes
//! only what is read. A classifier that reads its class token (`x[:, 0]`, a `Slice` after
//! `passes::GatherNdViews`) after a transformer's last layer computes the last MLP, its
//! LayerNorms, the output projection and the attention's queries for that one row rather than
//! for every token; a decoder that reads its last position before the vocabulary projection
//! (`hidden[:, -1:]`) likewise.
//!
//! A slice moves only where every reader of its input is the same slice (an input also read
//! whole, as the keys and values of that attention are, keeps its slice after it), never past
//! a graph output, and through: pointwise ops (broadcast inputs keep their size-1 or missing
//! axes whole), casts and identities, LayerNorm/RMSNorm over later axes, softmax along another
//! axis, matrix products (A's rows, or batch axes of both), `Gemm` rows, attention's queries
//! and batch axes, transposes (the slice permuted), and reshapes where the kept positions of
//! one axis are a contiguous run of one axis of the input.

use super::Pass;
use crate::ir::{Graph, IrError, NodeId, Op, SliceAxis};

/// Moves slices before the ops that make their inputs (see the module's documentation).
pub struct SliceEarly;

/// A bound on the moves of one run (each moves a slice one op nearer the inputs).
const MOST_MOVES: usize = 100_000;

impl Pass for SliceEarly {
    fn name(&self) -> &'static str {
        "slice-early"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut moved = 0;
        loop {
            let mut changed = false;
            for id in graph.topo_order()?.into_iter().rev() {
                if moved >= MOST_MOVES {
                    return Ok(moved);
                }
                if graph.contains(id) && matches!(graph.node(id).op, Op::Slice { .. }) && move_up(graph, id)?
                {
                    changed = true;
                    moved += 1;
                }
            }
            if !changed {
                return Ok(moved);
            }
        }
    }
}

/// Whether `axis` of a slice takes the whole of an axis of `size`.
fn whole(axis: &SliceAxis, size: usize) -> bool {
    *axis == all(size)
}

/// The slice axis that takes the whole of an axis of `size`.
fn all(size: usize) -> SliceAxis {
    SliceAxis { start: 0, step: 1, len: size }
}

/// Whether slice `axes` take the whole of every axis of `shape`.
fn takes_all(axes: &[SliceAxis], shape: &[usize]) -> bool {
    axes.iter().zip(shape).all(|(a, &size)| whole(a, size))
}

/// The slice `axes` (of an output of `out` rank) as it applies to an input of `shape` that
/// broadcasts to that output (aligned at the last axis): axes the input lacks or holds once
/// are taken whole.
fn broadcast(axes: &[SliceAxis], shape: &[usize]) -> Vec<SliceAxis> {
    let lead = axes.len() - shape.len();
    shape
        .iter()
        .enumerate()
        .map(|(a, &size)| {
            let axis = axes[lead + a];
            if size == 1 || whole(&axis, size) {
                all(size)
            } else {
                axis
            }
        })
        .collect()
}

/// The input slices and the op that, applied to them, gives `slice` of `op`'s output (of
/// `out_shape`, from inputs of `in_shapes`); `None` where the op does not allow it.
fn rewritten(
    op: &Op,
    slice: &[SliceAxis],
    out_shape: &[usize],
    in_shapes: &[Vec<usize>],
) -> Option<(Op, Vec<Vec<SliceAxis>>)> {
    let rank = out_shape.len();
    let sliced: Vec<usize> = (0..rank).filter(|&a| !whole(&slice[a], out_shape[a])).collect();
    // Broadcasting against the output (pointwise ops; a broadcast input must not be wider than
    // the output along a sliced axis).
    let pointwise = || -> Option<Vec<Vec<SliceAxis>>> {
        in_shapes.iter().map(|shape| (shape.len() <= rank).then(|| broadcast(slice, shape))).collect()
    };
    match op {
        op if op.is_pointwise() => Some((op.clone(), pointwise()?)),
        Op::Identity | Op::Dropout => Some((op.clone(), pointwise()?)),
        Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } if sliced.iter().all(|a| a < axis) => {
            // Scale and bias have the normalised axes only: kept whole.
            Some((op.clone(), pointwise()?))
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } if !sliced.contains(axis) => {
            Some((op.clone(), pointwise()?))
        }
        Op::MatMul => {
            let [a, b] = in_shapes else { return None };
            if a.len() < 2 || b.len() < 2 || sliced.contains(&(rank - 1)) {
                return None;
            }
            // A: its rows and batch axes; B: batch axes only (its rows are the reduced axis).
            let mut on_a = slice.to_vec();
            on_a[rank - 1] = all(a[a.len() - 1]);
            let mut on_b = slice.to_vec();
            on_b[rank - 2] = all(b[b.len() - 2]);
            on_b[rank - 1] = all(b[b.len() - 1]);
            Some((op.clone(), vec![broadcast(&on_a, a), broadcast(&on_b, b)]))
        }
        Op::Gemm { trans_a: false, .. } if sliced == [0] => {
            let a = &in_shapes[0];
            let mut inputs = vec![vec![slice[0], all(a[1])]];
            inputs.push(in_shapes[1].iter().copied().map(all).collect());
            if let Some(c) = in_shapes.get(2) {
                if c.len() > rank {
                    return None;
                }
                inputs.push(broadcast(slice, c));
            }
            Some((op.clone(), inputs))
        }
        Op::Attention { .. } if !sliced.contains(&(rank - 1)) => {
            // q [.., S, D], kt [.., D, T], v [.., T, Dv], mask [.., S, T]: the queries' rows
            // and every batch axis.
            let mut inputs = Vec::with_capacity(in_shapes.len());
            for (i, shape) in in_shapes.iter().enumerate() {
                if shape.len() < 2 || shape.len() > rank {
                    return None;
                }
                let mut axes = slice.to_vec();
                let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
                axes[rank - 1] = all(cols);
                if i == 1 || i == 2 {
                    axes[rank - 2] = all(rows);
                }
                inputs.push(broadcast(&axes, shape));
            }
            Some((op.clone(), inputs))
        }
        Op::Transpose { perm } => {
            let mut on_input = vec![all(0); rank];
            for (o, &i) in perm.iter().enumerate() {
                on_input[i] = slice[o];
            }
            Some((op.clone(), vec![on_input]))
        }
        Op::Reshape { .. } => {
            let [axis] = sliced[..] else { return None };
            let cut = slice[axis];
            if cut.step != 1 {
                return None;
            }
            let input = &in_shapes[0];
            let outer: usize = out_shape[..axis].iter().product();
            let inner: usize = out_shape[axis + 1..].iter().product();
            // An input axis with the same outer product whose whole positions hold the cut
            // (the kept run of each outer block, `[start · inner, (start + len) · inner)`).
            let b = (0..input.len()).find(|&b| {
                let inner_in: usize = input[b + 1..].iter().product();
                input[..b].iter().product::<usize>() == outer
                    && inner_in > 0
                    && (cut.start * inner) % inner_in == 0
                    && (cut.len * inner) % inner_in == 0
                    && (cut.start + cut.len) * inner <= input[b] * inner_in
            })?;
            let inner_in: usize = input[b + 1..].iter().product();
            let mut on_input: Vec<SliceAxis> = input.iter().copied().map(all).collect();
            on_input[b] =
                SliceAxis { start: cut.start * inner / inner_in, step: 1, len: cut.len * inner / inner_in };
            let mut shape = out_shape.to_vec();
            shape[axis] = cut.len;
            Some((Op::Reshape { shape }, vec![on_input]))
        }
        _ => None,
    }
}

/// `input` sliced by `axes`: itself where they take everything, an existing identical slice
/// of it where there is one, else a new one.
fn slice_of(graph: &mut Graph, input: NodeId, axes: Vec<SliceAxis>, name: &str) -> Result<NodeId, IrError> {
    let shape = graph.node(input).ty.shape.clone();
    if takes_all(&axes, &shape) {
        return Ok(input);
    }
    let existing = graph
        .users_of(input)
        .into_iter()
        .find(|&u| matches!(&graph.node(u).op, Op::Slice { axes: theirs } if *theirs == axes));
    if let Some(existing) = existing {
        return Ok(existing);
    }
    let origin = graph.node(input).origin.clone();
    graph.add_op(Op::Slice { axes }, &[input], name, origin)
}

/// Moves slice `id` before the op that makes its input, where every reader of that input is
/// the same slice; whether it moved.
fn move_up(graph: &mut Graph, id: NodeId) -> Result<bool, IrError> {
    let Op::Slice { axes } = graph.node(id).op.clone() else { return Ok(false) };
    let [source] = graph.inputs_of(id)[..] else { return Ok(false) };
    if graph.outputs().iter().any(|&(_, o)| o == source) {
        return Ok(false);
    }
    let out_shape = graph.node(source).ty.shape.clone();
    if axes.len() != out_shape.len() || takes_all(&axes, &out_shape) {
        return Ok(false);
    }
    let readers = graph.users_of(source);
    let same =
        |graph: &Graph, u: NodeId| matches!(&graph.node(u).op, Op::Slice { axes: theirs } if *theirs == axes);
    if !readers.iter().all(|&u| same(graph, u)) {
        return Ok(false);
    }
    let inputs = graph.inputs_of(source);
    let in_shapes: Vec<Vec<usize>> = inputs.iter().map(|&i| graph.node(i).ty.shape.clone()).collect();
    let Some((op, slices)) = rewritten(&graph.node(source).op, &axes, &out_shape, &in_shapes) else {
        return Ok(false);
    };
    let name = graph.node(source).name.clone();
    let origin = graph.node(source).origin.clone();
    let mut sliced = Vec::with_capacity(inputs.len());
    for (&input, axes) in inputs.iter().zip(slices) {
        sliced.push(slice_of(graph, input, axes, &format!("{name}/rows"))?);
    }
    let moved = graph.add_op(op, &sliced, &name, origin)?;
    if graph.node(moved).ty != graph.node(id).ty {
        // Not the slice's type after all: leave the graph as it was.
        graph.remove_node(moved);
        for s in sliced {
            if !inputs.contains(&s) && graph.users_of(s).is_empty() {
                graph.remove_node(s);
            }
        }
        return Ok(false);
    }
    for reader in readers {
        graph.replace_uses(reader, moved);
        graph.remove_node(reader);
    }
    graph.remove_node(source);
    Ok(true)
}
