//! Elementwise kernels (pointwise, gathers, copies) next to each other in the program, none
//! reading or overwriting what another of them reads or writes, launched as one: the first
//! kernel's blocks, then the next one's, each block running its own kernel's body. A decoding
//! step at batch 1 is a chain of dependent launches, each costing ~1.7 µs on an H200 whatever
//! it computes (`benches/NOTES.md`); the Llama-style decoder's step ran the rotary embeddings
//! of a layer's queries and of its new key as two such launches, its rotary tables' cosines
//! and sines as two more, and GPT-2's its two embeddings' gathers. The merged step keeps the
//! others' indices: the steps it stands in for stay in the program, and the runtime leaves
//! them out ([`KernelSource::merges`]).
//!
//! Only kernels of the elementwise template with a fixed number of blocks are merged (in a
//! bundle for ranges, those whose units do not follow a range), at most
//! [`crate::plan::siblings::MOST`] a launch; `FUSEC_MERGE_SIBLINGS=0` (at compile time) merges
//! none.

use std::collections::HashSet;

use super::kernel::BLOCK;
use super::{KernelSource, Step};
use crate::fusion::Kernel;
use crate::ir::NodeId;
use crate::plan::siblings::sibling_runs;
use crate::plan::{ranges_meet, stored_value, Location, Plan};

/// Merges each run of neighbouring elementwise steps of `steps` (one per kernel of `plan`; the
/// runs [`sibling_runs`] finds, whose reads the planner kept alive to the run's end) into its
/// first step, where their kernels are of the elementwise template, of a fixed number of
/// blocks, and their memory is apart; `share` names the merged kernel's function as the
/// other steps' are named.
pub(super) fn merge(plan: &Plan, steps: &mut [Step], share: &mut dyn FnMut(&mut KernelSource)) {
    if steps.len() != plan.kernels.len() {
        return;
    }
    // Steps a GEMM's kernel for a few rows may stand in for stay as they are.
    let absorbed: HashSet<usize> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Gemm { absorbs, .. } => *absorbs,
            _ => None,
        })
        .collect();
    // (The runs hold elementwise kernels only, and do not overlap.)
    let mergeable = |steps: &[Step], k: usize| -> Option<Part> {
        let Step::Launch(source) = &steps[k] else { return None };
        if absorbed.contains(&k) {
            return None;
        }
        Part::new(source, memory(plan, &plan.kernels[k])?)
    };
    for (first, last) in sibling_runs(&plan.graph, &plan.kernels) {
        let mut k = first;
        while k <= last {
            let Some(head) = mergeable(steps, k) else {
                k += 1;
                continue;
            };
            let mut run = vec![head];
            let mut next = k + 1;
            while next <= last {
                match mergeable(steps, next) {
                    Some(part) if run.iter().all(|p| p.memory.apart(&part.memory)) => run.push(part),
                    _ => break,
                }
                next += 1;
            }
            if run.len() > 1 {
                let Step::Launch(source) = &steps[k] else { unreachable!() };
                let mut merged = compose(source, &run);
                merged.merges = (k + 1..next).collect();
                share(&mut merged);
                steps[k] = Step::Launch(merged);
            }
            k = next;
        }
    }
}

/// The arena bytes a kernel reads and writes (weights are only read).
struct Memory {
    reads: Vec<(usize, usize)>,
    writes: Vec<(usize, usize)>,
}

impl Memory {
    /// Whether two kernels may run at once: neither writes what the other reads or writes.
    fn apart(&self, other: &Memory) -> bool {
        let meet = |a: &[(usize, usize)], b: &[(usize, usize)]| {
            a.iter().any(|&x| b.iter().any(|&y| ranges_meet(x, y)))
        };
        !meet(&self.writes, &other.reads)
            && !meet(&self.writes, &other.writes)
            && !meet(&other.writes, &self.reads)
    }
}

/// What `kernel` reads (each value from outside it, through views, whole) and writes; `None`
/// where a value's memory is not known.
fn memory(plan: &Plan, kernel: &Kernel) -> Option<Memory> {
    let graph = &plan.graph;
    let inside: HashSet<NodeId> = kernel.nodes.iter().copied().collect();
    // The stored value (or constant written into the source) behind `id`'s views.
    let span = |id: NodeId| -> Option<Option<(usize, usize)>> {
        let at = |n: NodeId| plan.locations.contains_key(&n) || graph.constant(n).is_some();
        let source = stored_value(graph, id, &at)?;
        Some(match plan.locations.get(&source) {
            Some(&Location::Arena(offset)) => Some((offset, graph.node(source).ty.size_bytes().max(1))),
            Some(&Location::Weights(_)) | None => None,
        })
    };
    let mut reads = Vec::new();
    for &node in &kernel.nodes {
        for input in graph.inputs_of(node) {
            if !inside.contains(&input) {
                reads.extend(span(input)?);
            }
        }
    }
    let mut writes = Vec::new();
    for &output in kernel.outputs.iter().chain(kernel.store_views.iter().map(|(value, _)| value)) {
        writes.extend(span(output)?);
    }
    Some(Memory { reads, writes })
}

/// One kernel of a merged launch: its body as a device function over a block index.
struct Part {
    memory: Memory,
    /// The kernel's function name (its source's entry point).
    function: String,
    /// Everything before the kernel's signature (comments, headers).
    prefix: String,
    /// Its parameters as declared (the run-time bound and the ranges' sizes left out).
    params: Vec<String>,
    /// Its body, from the opening brace, the block index read from `fusec_block`.
    body: String,
    blocks: u32,
    args: Vec<Location>,
}

impl Part {
    /// `source` as a part, where it is an elementwise kernel of a fixed number of blocks.
    fn new(source: &KernelSource, memory: Memory) -> Option<Part> {
        if source.block != BLOCK || !source.variants.is_empty() || source.attention.is_some() {
            return None;
        }
        let signature =
            format!("extern \"C\" __global__ void __launch_bounds__({BLOCK}) {}(", source.function);
        let at = source.source.find(&signature)?;
        let (prefix, rest) = source.source.split_at(at);
        let rest = &rest[signature.len()..];
        let close = rest.find(") {")?;
        let declared: Vec<&str> = rest[..close].split(", ").collect();
        let mut body = rest[close + 2..].to_string();
        // The units of a bundle for ranges that do not follow them: a literal bound.
        let (blocks, bound) = match &source.scale {
            None => (source.grid, None),
            Some(scale) => {
                let units = scale.units.value()?;
                let fixed = scale.times.value() == Some(1) && scale.bound;
                if !fixed {
                    return None;
                }
                (u32::try_from(units.div_ceil(scale.per_block.max(1) as usize).max(1)).ok()?, Some(units))
            }
        };
        if let Some(units) = bound {
            body = body.replace("fusec_limit", &format!("{units}LL"));
        }
        let params: Vec<String> = declared
            .iter()
            .filter(|p| !p.ends_with(" fusec_limit") && !p.contains(" fusec_d"))
            .map(|p| p.to_string())
            .collect();
        // A body that reads a range's size, or whose parameters are not all pointers the
        // arguments give, stays a kernel of its own.
        if body.contains("fusec_d") || params.len() != source.args.len() || body.contains("__shared__") {
            return None;
        }
        let body = body.replace("blockIdx.x", "fusec_block");
        Some(Part {
            memory,
            function: source.function.clone(),
            prefix: prefix.to_string(),
            params,
            body,
            blocks,
            args: source.args.clone(),
        })
    }
}

/// One kernel running `parts` (the first `head`'s), each on its own blocks.
fn compose(head: &KernelSource, parts: &[Part]) -> KernelSource {
    let mut source = format!(
        "// {}: {} elementwise kernels in one launch, each on its own blocks.\n",
        head.name,
        parts.len()
    );
    let mut defined = HashSet::new();
    // Each header once (the shared device code is pasted in where it is included).
    let mut lines_seen: HashSet<&str> = HashSet::new();
    let mut outer = Vec::new();
    let mut calls = String::new();
    let mut first_block = 0u32;
    let mut args = Vec::new();
    for (n, part) in parts.iter().enumerate() {
        if defined.insert(part.function.clone()) {
            for line in part.prefix.lines() {
                if !line.starts_with('#') || lines_seen.insert(line) {
                    source.push_str(line);
                    source.push('\n');
                }
            }
            source.push_str(&format!(
                "__device__ __forceinline__ void {}_part({}, const unsigned fusec_block) {}",
                part.function,
                part.params.join(", "),
                part.body
            ));
            source.push('\n');
        }
        let mut passed = Vec::new();
        for (j, declared) in part.params.iter().enumerate() {
            // `const __half* __restrict__ in3` → the type, and a name of the merged kernel's.
            let ty = declared.rsplit_once(' ').map_or(declared.as_str(), |(ty, _)| ty);
            outer.push(format!("{ty} p{n}_{j}"));
            passed.push(format!("p{n}_{j}"));
        }
        passed.push(format!("b - {first_block}u"));
        first_block += part.blocks;
        calls.push_str(&format!(
            "    if (b < {first_block}u) {{\n        {}_part({});\n        return;\n    }}\n",
            part.function,
            passed.join(", ")
        ));
        args.extend(part.args.iter().copied());
    }
    source.push_str(&format!(
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {}({}) {{\n    const unsigned b = blockIdx.x;\n{calls}}}\n",
        head.name,
        outer.join(", ")
    ));
    KernelSource::new(&head.name, source, first_block, BLOCK, args)
}
