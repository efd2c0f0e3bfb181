//! The execution plan: the partition's kernels in order, and where every value that exists
//! in device memory lives. Graph inputs and kernel outputs live in one arena, packed by
//! liveness (a buffer is reused once its last reader has run); constants that kernels read
//! live in one weights blob. Views are not stored: readers index through them. Knows nothing
//! of cudarc.

use std::collections::{BTreeMap, HashMap};

use thiserror::Error;

mod instance;
pub mod outproj;
pub mod siblings;

use crate::fusion::{Kernel, Partition};
use crate::ir::{Graph, IrError, NodeId, Op};

/// Every buffer starts on this boundary (bytes), so vector loads are aligned.
pub const ALIGN: usize = 256;

/// Constants larger than this are not searched for a [`Pattern`] (a causal mask expanded to
/// batch 32 × 512 × 512 is searched).
const MOST_PATTERN_ELEMENTS: usize = 1 << 24;

/// What the values of a constant follow (code generation writes such a constant as an
/// expression of the coordinates instead of reading it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern {
    /// Every element is this.
    Uniform(f64),
    /// `inside` where the last coordinate minus the one before is at most `k`, `outside`
    /// elsewhere, alike in every matrix of the leading axes (`tril(ones, k)`, a causal mask).
    Lower {
        /// The last diagonal inside (0: the main one).
        k: i64,
        /// The value on and below it.
        inside: f64,
        /// The value above it.
        outside: f64,
    },
}

/// The pattern `value`'s elements follow, if one does.
pub(crate) fn pattern(value: &crate::ir::Tensor) -> Option<Pattern> {
    let values = value.to_f64_vec();
    let first = *values.first()?;
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits();
    let Some(&outside) = values.iter().find(|&&v| !same(v, first)) else {
        return Some(Pattern::Uniform(first));
    };
    let shape = value.shape();
    let &[.., rows, columns] = shape else { return None };
    let matrix = &values[..rows * columns];
    [(first, outside), (outside, first)].into_iter().find_map(|(inside, outside)| {
        // A row with `inside` up to column i + k, and not all of it, says k.
        let k = (0..rows).find_map(|i| {
            let run = matrix[i * columns..(i + 1) * columns].iter().take_while(|&&v| same(v, inside)).count();
            (run > 0 && run < columns).then(|| run as i64 - 1 - i as i64)
        })?;
        let follows = values.chunks_exact(rows * columns).all(|m| {
            m.iter().enumerate().all(|(p, &v)| {
                let (i, j) = ((p / columns) as i64, (p % columns) as i64);
                same(v, if j - i <= k { inside } else { outside })
            })
        });
        follows.then_some(Pattern::Lower { k, inside, outside })
    })
}

/// Why memory could not be planned.
#[derive(Debug, Error)]
pub enum PlanError {
    /// The graph is not valid (a cycle, a dangling edge).
    #[error("plan: {0}")]
    Ir(#[from] IrError),
    /// A kernel reads a value that no kernel writes and no constant or input holds.
    #[error("plan: value '{0}' is read but nothing computes or stores it")]
    Unmaterialised(String),
    /// An append in place whose first input is not a graph input, or that is two outputs.
    #[error("plan: '{0}' appends in place to something other than a graph input of its own")]
    Append(String),
}

/// Where a value lives in device memory (byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Location {
    /// In the activation arena, at this offset.
    Arena(usize),
    /// In the weights, at this offset.
    Weights(usize),
}

/// A graph input or output: its name, value, and where it lives.
#[derive(Clone, Debug)]
pub struct Binding {
    /// The ONNX name.
    pub name: String,
    /// The graph's node for it.
    pub value: NodeId,
    /// Where it lives.
    pub location: Location,
    /// For an input stored inside an output ([`Op::Append`]): how its rows lie there.
    pub inside: Option<Inside>,
}

/// An input stored inside an output's buffer: `rows` rows of `row_bytes` bytes, one every
/// `pitch_bytes` from the input's location (the output's), the rest of each row the output's
/// own. A key/value cache `[batch, heads, past, dim]` inside `present` `[batch, heads, past +
/// new, dim]`: `batch·heads` rows of `past·dim` elements, `(past + new)·dim` apart.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Inside {
    /// The output it is stored in.
    pub output: String,
    /// Rows.
    pub rows: usize,
    /// Bytes of the input in each row.
    pub row_bytes: usize,
    /// Bytes from one row's start to the next.
    pub pitch_bytes: usize,
}

impl Inside {
    /// The bytes the input spans from its location (the last row only to its end).
    pub fn span_bytes(&self) -> usize {
        match self.rows {
            0 => 0,
            rows => (rows - 1) * self.pitch_bytes + self.row_bytes,
        }
    }
}

/// How input `past` of `append` (an [`Op::Append`] along `axis`) lies inside its buffer.
fn inside_of(graph: &Graph, append: NodeId, past: NodeId, axis: usize, output: &str) -> Inside {
    let (p, a) = (&graph.node(past).ty, &graph.node(append).ty);
    let inner = |shape: &[usize]| shape[axis..].iter().product::<usize>() * p.dtype.size_bytes();
    Inside {
        output: output.to_string(),
        rows: p.shape[..axis].iter().product(),
        row_bytes: inner(&p.shape),
        pitch_bytes: inner(&a.shape),
    }
}

/// The partition's kernels in order, with every value given a place in device memory: one
/// arena for activations (buffers reused once dead) and the weights blob.
pub struct Plan {
    /// The program's graph. Constants placed in `weights` keep their node and type but no
    /// longer their value (an empty tensor stands in): their bytes are in `weights`, and a
    /// model's weights are not held twice.
    pub graph: Graph,
    /// The kernels, in launch order.
    pub kernels: Vec<Kernel>,
    /// Where each stored value lives.
    pub locations: HashMap<NodeId, Location>,
    /// The arena's size in bytes.
    pub arena_bytes: usize,
    /// The constants kernels read, each at its offset.
    pub weights: Vec<u8>,
    /// The model's inputs, in order.
    pub inputs: Vec<Binding>,
    /// The model's outputs, in order.
    pub outputs: Vec<Binding>,
    /// Points where the GPU path stops ([`Partition::graph_breaks`]).
    pub graph_breaks: usize,
    /// For a program that runs ranges of sizes: the ranges, and the size of every value as
    /// an expression of them (`None`: one size). The shapes of the graph are those at the top
    /// of every range, and memory is planned for them.
    pub symbolic: Option<crate::ir::SymbolicShapes>,
    /// Memory of the arena no value is placed in, zeros when the program is loaded, where a
    /// batch's decoding attention that computes the output projection after it adds the
    /// heads' partial products ([`outproj`]): its offset in the arena, shared by every layer.
    pub scratch: Option<Location>,
    /// The patterns of the constants [`Plan::constant_pattern`] was asked for.
    patterns: std::sync::Mutex<HashMap<NodeId, Option<Pattern>>>,
}

impl Plan {
    /// Whether the program's kernels take the sizes of its ranges as parameters (`fusec_d<i>`)
    /// and their launches follow them: every kernel of a program for ranges of sizes.
    pub fn scaled(&self) -> bool {
        self.symbolic.is_some()
    }

    /// The shape of `id`, with the sizes that follow a range as expressions of it.
    pub fn dims(&self, id: NodeId) -> Vec<crate::ir::SymDim> {
        match &self.symbolic {
            Some(symbolic) if !symbolic.shape(id).is_empty() || self.graph.node(id).ty.rank() == 0 => {
                symbolic.shape(id).to_vec()
            }
            _ => crate::ir::SymDim::lits(&self.graph.node(id).ty.shape),
        }
    }

    /// The sizes of `id`'s shape, where none follows a range.
    pub fn sizes(&self, id: NodeId) -> Option<Vec<usize>> {
        self.dims(id).iter().map(crate::ir::SymDim::value).collect()
    }

    /// Writes every constant placed in the weights into the blob and lets its value in the
    /// graph go. Each constant's bytes are written into its own slice of the blob on every
    /// core; its value goes as soon as it is written, so the blob and the values not yet
    /// written are what is in memory. Constants already written are left as they are.
    pub fn place_weights(&mut self) {
        if !self.weights.is_empty() {
            return;
        }
        let mut placed: Vec<(usize, NodeId)> = self
            .locations
            .iter()
            .filter_map(|(&id, &l)| match l {
                Location::Weights(offset)
                    if self
                        .graph
                        .constant(id)
                        .is_some_and(|t| !t.is_empty() || self.graph.node(id).ty.is_empty()) =>
                {
                    Some((offset, id))
                }
                _ => None,
            })
            .collect();
        placed.sort_unstable();
        let total =
            placed.last().map_or(0, |&(offset, id)| offset + aligned(self.graph.node(id).ty.size_bytes()));
        let mut weights = vec![0u8; total];
        let mut jobs = Vec::with_capacity(placed.len());
        let mut rest = weights.as_mut_slice();
        let mut at = 0;
        for (offset, id) in placed {
            let size = aligned(self.graph.node(id).ty.size_bytes());
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(offset - at);
            let (slot, tail) = tail.split_at_mut(size);
            rest = tail;
            at = offset + size;
            if let Some(value) = self.graph.take_constant(id) {
                jobs.push((slot, value));
            }
        }
        crate::parallel::map_owned(jobs, |(slot, value)| write_tensor_bytes(slot, &value));
        self.weights = weights;
    }

    /// The pattern constant `id`'s values follow, if one does: read back from the weights the
    /// first time it is asked for (constants of at most 2^24 elements), then
    /// remembered, since every attention kernel of a model may ask for the same mask.
    pub fn constant_pattern(&self, id: NodeId) -> Option<Pattern> {
        let mut known = self.patterns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *known.entry(id).or_insert_with(|| {
            let Some(&Location::Weights(offset)) = self.locations.get(&id) else { return None };
            let ty = &self.graph.node(id).ty;
            if ty.shape.iter().product::<usize>() > MOST_PATTERN_ELEMENTS {
                return None;
            }
            let mut value = crate::ir::Tensor::full(ty, 0.0);
            read_tensor_bytes(self.weights.get(offset..offset + ty.size_bytes())?, &mut value);
            pattern(&value)
        })
    }

    /// The shape `id` is laid out in where it is stored: a constant in the weights is stored
    /// once, at the top of every range, and read there at any size (its values at a smaller
    /// size are its leading part: [`crate::pipeline::plan_symbolic`] checks it); every other
    /// value is laid out at the size the program runs.
    pub fn stored_dims(&self, id: NodeId) -> Vec<crate::ir::SymDim> {
        match self.locations.get(&id) {
            Some(Location::Weights(_)) => crate::ir::SymDim::lits(&self.graph.node(id).ty.shape),
            _ => self.dims(id),
        }
    }
}

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN).max(1) * ALIGN
}

/// Whether the byte ranges `(start, length)` `a` and `b` share a byte.
pub fn ranges_meet(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// The value whose memory `id` reads: `id` itself, or the source of the view chain it is.
pub fn stored_value(graph: &Graph, mut id: NodeId, stored: &impl Fn(NodeId) -> bool) -> Option<NodeId> {
    loop {
        if stored(id) {
            return Some(id);
        }
        if !graph.node(id).op.is_view() {
            return None;
        }
        id = graph.inputs_of(id)[0];
    }
}

/// The most rows of A a GEMM may have to get codegen's kernel for a few rows (which may take in
/// the norm before it; `codegen::skinny`: on CUDA cores up to 8, on tensor cores up to 64).
pub const FEW_ROWS: usize = 64;

/// Whether `next` is a GEMM of at most [`FEW_ROWS`] rows right after `norm`, a LayerNorm or
/// RMSNorm kernel (which that GEMM's kernel may compute itself) — or (unless `FUSEC_SKINNY_GATE=0`) a
/// pointwise kernel with a sigmoid (a gated MLP's gate, `codegen::skinny::gate_before`).
fn few_row_gemm_after_prologue(graph: &Graph, norm: &Kernel, next: &Kernel) -> bool {
    use crate::fusion::KernelKind;
    let gate = || {
        norm.kind == KernelKind::Pointwise
            && norm.nodes.iter().any(|&n| graph.node(n).op == Op::Unary(crate::ir::UnaryOp::Sigmoid))
            && !crate::knobs::off("FUSEC_SKINNY_GATE")
    };
    let is_norm = matches!(&norm.kind, KernelKind::RowReduction { op } if op == "LayerNorm" || op == "RmsNorm")
        || gate();
    let Some(&gemm) = next.nodes.first() else { return false };
    let ty = &graph.node(gemm).ty;
    let rows = ty.shape.split_last().map_or(0, |(_, lead)| lead.iter().product::<usize>());
    is_norm && matches!(next.kind, KernelKind::Gemm { .. }) && rows <= FEW_ROWS
}

/// The most rows (sequences of a batch) at which a decoding attention may compute its Q, K and
/// V projection itself (`codegen::attention::rows`).
pub const PROJECTED_ROWS: usize = 32;

/// The most rows at which a batch's decoding attention computes its projection by default. GPT-2
/// small's step on an H200 (`fusec generate` 128 + 256 fp16, ms a token,
/// `FUSEC_ATTENTION_QKV_ROWS=0` against it): 8 rows 0.244–0.248 against 0.252–0.256, 16 rows
/// 0.299–0.304 against 0.313–0.316, but 32 rows 0.409–0.416 against 0.398–0.402: there the
/// product's kernel and the attention's overlap (the attention's blocks read their first keys
/// while the product runs), and one cluster of 8 blocks a head leaves 36 multiprocessors idle
/// while the cache is read (`benches/NOTES.md`, fifty-second session).
const DEFAULT_PROJECTED_ROWS: usize = 16;

/// The most rows at which a batch's decoding attention computes its Q, K and V projection:
/// `DEFAULT_PROJECTED_ROWS`, or what `FUSEC_ATTENTION_QKV_ROWS` says (`=0` none, for
/// measuring), at most [`PROJECTED_ROWS`]. The plan and the kernel's generator read the same
/// number, so the product's inputs are kept live only where the kernel takes the product.
pub fn projected_rows() -> usize {
    crate::knobs::number("FUSEC_ATTENTION_QKV_ROWS").unwrap_or(DEFAULT_PROJECTED_ROWS).min(PROJECTED_ROWS)
}

/// Whether a batch of `rows` sequences (2 or more) has its decoding attention compute its Q, K
/// and V projection: at most [`projected_rows`].
pub fn projects_batch(rows: usize) -> bool {
    (2..=projected_rows()).contains(&rows)
}

/// Whether `next` is a decoding attention (it appends to a cache) right after GEMM `gemm` of
/// one row, or of a few (a batch of sequences, at most [`projected_rows`]): the
/// attention's kernel may compute the product, and the plan keeps what the GEMM
/// reads until it has (`codegen::attention::qkv` and `rows` take the product in only where this holds).
pub(crate) fn decoding_attention_after_gemm(graph: &Graph, gemm: &Kernel, next: &Kernel) -> bool {
    use crate::fusion::KernelKind;
    let Some(&product) = gemm.nodes.first() else { return false };
    let ty = &graph.node(product).ty;
    let rows = ty.shape.split_last().map_or(0, |(_, lead)| lead.iter().product::<usize>());
    matches!(gemm.kind, KernelKind::Gemm { .. })
        && next.kind == KernelKind::Attention
        && (rows == 1 || projects_batch(rows))
        && next.nodes.iter().any(|&n| matches!(graph.node(n).op, Op::Append { .. }))
}

/// First-fit allocation in the arena: free ranges kept sorted by offset.
#[derive(Default)]
struct Arena {
    free: BTreeMap<usize, usize>,
    end: usize,
}

impl Arena {
    fn allocate(&mut self, bytes: usize) -> usize {
        let bytes = aligned(bytes);
        if let Some((&offset, &size)) = self.free.iter().find(|(_, &size)| size >= bytes) {
            self.free.remove(&offset);
            if size > bytes {
                self.free.insert(offset + bytes, size - bytes);
            }
            return offset;
        }
        let offset = self.end;
        self.end += bytes;
        offset
    }

    fn release(&mut self, offset: usize, bytes: usize) {
        let bytes = aligned(bytes);
        self.free.insert(offset, bytes);
        // Merge with neighbours.
        let merged: Vec<(usize, usize)> = self.free.iter().map(|(&o, &s)| (o, s)).collect();
        self.free.clear();
        for (o, s) in merged {
            match self.free.iter_mut().next_back() {
                Some((&last, size)) if last + *size == o => *size += s,
                _ => {
                    self.free.insert(o, s);
                }
            }
        }
    }
}

impl Plan {
    /// Lays out memory for running `partition` over `graph`.
    pub fn new(graph: Graph, partition: Partition) -> Result<Plan, PlanError> {
        let mut plan = Plan::unplaced(graph, partition)?;
        plan.place_weights();
        Ok(plan)
    }

    /// [`Plan::new`] with every constant's place in the weights decided but its value still
    /// in the graph ([`Plan::place_weights`] writes the blob): what the planner for ranges
    /// compares at several sizes, the values shared between them rather than copied.
    pub fn unplaced(graph: Graph, partition: Partition) -> Result<Plan, PlanError> {
        let graph_breaks = partition.graph_breaks;
        let kernels = partition.kernels;
        let mut computed: HashMap<NodeId, usize> = HashMap::new();
        for (k, kernel) in kernels.iter().enumerate() {
            for &o in &kernel.outputs {
                computed.insert(o, k);
            }
            // A value stored in a view's layout is read as that view.
            for &(_, view) in &kernel.store_views {
                computed.insert(view, k);
            }
        }
        let is_stored = |id: NodeId| {
            computed.contains_key(&id) || matches!(graph.node(id).op, Op::Input { .. } | Op::Constant(_))
        };
        // Last kernel reading each stored value (graph outputs: never released).
        let mut last_read: HashMap<NodeId, usize> = HashMap::new();
        let name = |id: NodeId| graph.node(id).name.clone();
        for (k, kernel) in kernels.iter().enumerate() {
            for &node in &kernel.nodes {
                for input in graph.inputs_of(node) {
                    if kernel.nodes.contains(&input) {
                        continue;
                    }
                    // A value the kernel computes itself, read through views (an attention
                    // kernel's mask prologue), is not read from memory.
                    let here_or_stored = |n: NodeId| kernel.nodes.contains(&n) || is_stored(n);
                    let source = stored_value(&graph, input, &here_or_stored)
                        .ok_or_else(|| PlanError::Unmaterialised(name(input)))?;
                    if !kernel.nodes.contains(&source) {
                        last_read.insert(source, k);
                    }
                }
            }
        }
        // What a kernel reads is kept through the next one where that one may compute it
        // while writing its own outputs: a norm's (or gate's) inputs through the GEMM of a few
        // rows right after it (`codegen::skinny`), a GEMM of one row's (and so, in turn, the
        // norm's before it) through the decoding attention right after it
        // (`codegen::attention::qkv`).
        for k in 0..kernels.len().saturating_sub(1) {
            let (this, next) = (&kernels[k], &kernels[k + 1]);
            if few_row_gemm_after_prologue(&graph, this, next)
                || decoding_attention_after_gemm(&graph, this, next)
                || outproj::scratch_bytes(&graph, this, next).is_some()
            {
                for last in last_read.values_mut().filter(|last| **last == k) {
                    *last = k + 1;
                }
            }
        }
        // What a run of pointwise kernels launched as one reads is kept to the run's end.
        for (first, last) in siblings::sibling_runs(&graph, &kernels) {
            for read in last_read.values_mut().filter(|read| (first..last).contains(*read)) {
                *read = last;
            }
        }
        // (name, output value, the stored value holding its bytes): a graph output that is a
        // reshape of a stored value shares its memory but keeps its own type.
        let mut outputs_stored = Vec::new();
        for (out_name, id) in graph.outputs() {
            let source =
                stored_value(&graph, *id, &is_stored).ok_or_else(|| PlanError::Unmaterialised(name(*id)))?;
            outputs_stored.push((out_name.clone(), *id, source));
        }
        let keep: std::collections::HashSet<NodeId> = outputs_stored.iter().map(|(_, _, s)| *s).collect();

        let mut locations = HashMap::new();
        // In node order, so that a model compiles to the same weights layout (and kernel
        // sources, which the NVRTC cache keys on) every time.
        let mut constants: Vec<NodeId> = last_read.keys().chain(keep.iter()).copied().collect();
        constants.sort_unstable();
        constants.dedup();
        constants.retain(|&id| graph.constant(id).is_some());
        let mut offset = 0;
        for id in constants {
            locations.insert(id, Location::Weights(offset));
            offset += aligned(graph.node(id).ty.size_bytes());
        }
        let mut arena = Arena::default();
        let bytes = |id: NodeId| graph.node(id).ty.size_bytes();
        // A cache appended to in place: its buffer is there from the start, the input inside.
        let mut inside = HashMap::new();
        for (out_name, id) in graph.outputs() {
            let Op::Append { axis } = graph.node(*id).op else { continue };
            let past = graph.inputs_of(*id)[0];
            if !graph.inputs().contains(&past) || locations.contains_key(id) {
                return Err(PlanError::Append(graph.node(*id).name.clone()));
            }
            let offset = arena.allocate(bytes(*id));
            locations.insert(*id, Location::Arena(offset));
            inside.insert(past, (offset, inside_of(&graph, *id, past, axis, out_name)));
        }
        let mut inputs = Vec::new();
        for &id in graph.inputs() {
            let (location, within) = match inside.remove(&id) {
                Some((offset, within)) => (Location::Arena(offset), Some(within)),
                None => (Location::Arena(arena.allocate(bytes(id))), None),
            };
            locations.insert(id, location);
            inputs.push(Binding { name: graph.node(id).name.clone(), value: id, location, inside: within });
        }
        for (k, kernel) in kernels.iter().enumerate() {
            let written: Vec<NodeId> = kernel
                .outputs
                .iter()
                .map(|&o| kernel.store_views.iter().find(|(v, _)| *v == o).map_or(o, |&(_, view)| view))
                .collect();
            for w in written {
                if matches!(graph.node(w).op, Op::Append { .. }) && locations.contains_key(&w) {
                    continue;
                }
                let offset = arena.allocate(bytes(w));
                locations.insert(w, Location::Arena(offset));
            }
            for (&value, &last) in &last_read {
                if last == k && !keep.contains(&value) && !graph.inputs().contains(&value) {
                    if let Some(Location::Arena(offset)) = locations.get(&value) {
                        arena.release(*offset, bytes(value));
                    }
                }
            }
        }
        // The partial products' memory, past every value's: never reused, so the counters in it
        // stay as the kernels leave them (zero).
        let scratch_bytes =
            kernels.windows(2).filter_map(|pair| outproj::scratch_bytes(&graph, &pair[0], &pair[1])).max();
        let scratch = scratch_bytes.map(|bytes| {
            let offset = arena.end;
            arena.end += aligned(bytes);
            Location::Arena(offset)
        });
        let outputs = outputs_stored
            .into_iter()
            .map(|(name, value, source)| Binding { name, value, location: locations[&source], inside: None })
            .collect();
        Ok(Plan {
            graph,
            kernels,
            locations,
            arena_bytes: arena.end,
            weights: Vec::new(),
            inputs,
            outputs,
            graph_breaks,
            symbolic: None,
            scratch,
            patterns: Default::default(),
        })
    }

    /// Kernels that are cuBLAS(Lt) GEMMs.
    pub fn gemm_calls(&self) -> usize {
        self.kernels.iter().filter(|k| matches!(k.kind, crate::fusion::KernelKind::Gemm { .. })).count()
    }

    /// Bytes of device memory the activations need at their peak.
    pub fn peak_activation_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// Estimated device-memory traffic of one run: each kernel reads every stored value it
    /// uses once and writes its outputs once (what the kernels would move if caches held
    /// nothing across launches and nothing inside a kernel were read twice).
    pub fn traffic_bytes(&self) -> u64 {
        self.kernels.iter().map(|k| self.kernel_traffic_bytes(k)).sum()
    }

    /// [`Plan::traffic_bytes`] of one kernel: the stored values it reads once each (of a
    /// table a gather picks from, the bytes it picks), and its outputs.
    pub fn kernel_traffic_bytes(&self, kernel: &Kernel) -> u64 {
        let graph = &self.graph;
        let stored = |id: NodeId| self.locations.contains_key(&id);
        let mut read = std::collections::HashSet::new();
        // Stored values a gather picks from, and the most bytes it picks (its output's): a
        // token's embedding row, not the whole table.
        let mut picked: std::collections::HashMap<NodeId, u64> = std::collections::HashMap::new();
        // An append in place reads nothing of the part already there and writes only the new
        // part.
        let appended = |id: NodeId| match graph.node(id).op {
            Op::Append { .. } => Some(graph.inputs_of(id)),
            _ => None,
        };
        let size = |id: NodeId| graph.node(id).ty.size_bytes() as u64;
        for &node in &kernel.nodes {
            let skip = appended(node).map(|inputs| inputs[0]);
            let gathers = matches!(
                graph.node(node).op,
                Op::Gather { .. } | Op::GatherElements { .. } | Op::GatherNd { .. }
            );
            for (i, input) in graph.inputs_of(node).into_iter().enumerate() {
                let here = kernel.nodes.contains(&input);
                // An append this kernel computes and then reads (the decoding attention over
                // the cache it appends to) is read whole.
                let read_back = here && appended(input).is_some() && appended(node).is_none();
                if (!here || read_back) && Some(input) != skip {
                    match stored_value(graph, input, &stored) {
                        Some(value) if gathers && i == 0 => *picked.entry(value).or_default() += size(node),
                        value => read.extend(value),
                    }
                }
            }
        }
        let picked: u64 = picked
            .iter()
            .filter(|(value, _)| !read.contains(value))
            .map(|(&value, &bytes)| bytes.min(size(value)))
            .sum();
        let written = kernel.outputs.iter().map(|&o| appended(o).map_or(o, |inputs| inputs[1]));
        picked + read.iter().copied().chain(written).map(size).sum::<u64>()
    }

    /// Floating-point operations of one run in its matrix products (GEMMs and attention),
    /// counting a multiply-add as two.
    pub fn flops(&self) -> u64 {
        let graph = &self.graph;
        let len = |id: NodeId| graph.node(id).ty.len() as u64;
        let dim = |id: NodeId, from_end: usize| {
            let shape = &graph.node(id).ty.shape;
            shape.len().checked_sub(from_end).map_or(1, |i| shape[i] as u64)
        };
        let mut total = 0u64;
        for kernel in &self.kernels {
            for &id in &kernel.nodes {
                let inputs = graph.inputs_of(id);
                total += match graph.node(id).op {
                    Op::MatMul => 2 * len(id) * dim(inputs[0], 1),
                    Op::Gemm { trans_a, .. } => 2 * len(id) * dim(inputs[0], if trans_a { 2 } else { 1 }),
                    // q·kᵀ over T keys, then p·v.
                    Op::Attention { .. } => 2 * (len(inputs[0]) + len(id)) * dim(inputs[1], 1),
                    _ => 0,
                };
            }
        }
        total
    }
}

/// The raw little-endian bytes of a tensor's elements, row-major
/// ([`crate::ir::Tensor::to_le_bytes`]).
pub fn tensor_bytes(t: &crate::ir::Tensor) -> Vec<u8> {
    t.to_le_bytes()
}

/// Appends `t`'s elements to `out` as [`tensor_bytes`] lays them out.
pub fn append_tensor_bytes(out: &mut Vec<u8>, t: &crate::ir::Tensor) {
    t.append_le_bytes(out)
}

/// Writes `t`'s elements into the start of `out` as [`tensor_bytes`] lays them out (as many
/// as fit).
pub fn write_tensor_bytes(out: &mut [u8], t: &crate::ir::Tensor) {
    t.write_le_bytes(out)
}

/// Fills `t` (its shape and type unchanged) from little-endian element bytes, the layout
/// [`write_tensor_bytes`] writes; elements past the end of `bytes` are left as they were.
pub fn read_tensor_bytes(bytes: &[u8], t: &mut crate::ir::Tensor) {
    t.read_le_bytes(bytes)
}
