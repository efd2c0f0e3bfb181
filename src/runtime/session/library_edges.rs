//! A library GEMM's kernel scheduled while the kernel before it finishes. fusec's own kernels
//! are launched with programmatic dependent launch (`launch_programmatic`), but a cuBLAS or
//! cuBLASLt call launches its kernels itself, so in a captured graph the edge into the library's
//! kernel is a full dependency: it is scheduled only once the kernel before it has ended and
//! flushed. A library kernel that begins with the wait for its predecessor
//! (`griddepcontrol.wait`) may be scheduled earlier, as fusec's are. While a graph is captured,
//! the edge into a library call is made programmatic; after the call, the kernel it reached is
//! looked up by name: known to wait (cuBLASLt's `sm90_xmma_gemm_*` kernels, whose machine code
//! was read, `benches/NOTES.md`), or found to by a probe ([`super::library_probe`]) run once a
//! process for each other kernel the first time it is reached. A step whose call, with its
//! algorithm, reached a kernel that does not wait (or anything but a kernel) keeps a plain edge
//! from then on; a failed call makes all of the session's library edges plain. Either way the
//! graph is captured again, so that at load each of a product's candidate algorithms is timed
//! with the edge it may have. `FUSEC_LIBRARY_PDL=0` (at load) never makes them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use cudarc::driver::sys;
use cudarc::driver::CudaStream;

use super::launch::Loaded;

/// Library kernels known to wait for their predecessor before reading memory, from their
/// machine code.
pub(super) fn library_kernel_waits(name: &str) -> bool {
    name.starts_with("sm90_xmma_gemm_")
}

/// What the probes of this process found, by kernel name.
static PROBED: Mutex<Option<HashMap<String, bool>>> = Mutex::new(None);

/// Whether the library kernel `name` waits for its predecessor: known, probed, or (`None`) not
/// known yet.
pub(super) fn verdict(name: &str) -> Option<bool> {
    if library_kernel_waits(name) {
        return Some(true);
    }
    let probed = PROBED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    probed.as_ref().and_then(|m| m.get(name).copied())
}

/// The library kernels this process has probed, by name, and whether each waits for its
/// predecessor.
pub fn probed_library_kernels() -> Vec<(String, bool)> {
    let probed = PROBED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut all: Vec<(String, bool)> = probed.iter().flatten().map(|(k, &v)| (k.clone(), v)).collect();
    all.sort();
    all
}

/// Records what a probe found for the kernel `name`.
pub(super) fn record_probe(name: &str, waits: bool) {
    let mut probed = PROBED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    probed.get_or_insert_with(HashMap::new).insert(name.to_string(), waits);
}

/// Whether the session makes edges into library calls programmatic, and what it has seen.
#[derive(Default)]
pub(super) struct LibraryEdges {
    /// sm_90 or later, and not turned off (`FUSEC_LIBRARY_PDL=0`).
    allowed: bool,
    /// The session's generated kernels are launched programmatically (the edges follow them).
    on: AtomicBool,
    /// A library call failed under capture: no more edges in this session.
    refused: AtomicBool,
    /// Steps (their addresses) with the algorithm each ran, whose call reached a kernel that
    /// does not wait: their edges stay plain.
    plain: Mutex<HashSet<(usize, [u64; 8])>>,
    /// The graph being captured holds an edge into a kernel not known to wait: capture it again.
    recapture: AtomicBool,
    /// Library kernels given a programmatic edge in the graph captured last.
    made: Mutex<Vec<String>>,
    /// Kernels reached that are not known yet, each with the address of the step whose call
    /// reached it, to be probed before the graph is captured again.
    pending: Mutex<Vec<(String, usize)>>,
}

/// The capture's dependencies a library call's kernel was given a programmatic edge from.
pub(super) struct Primaries(Vec<sys::CUgraphNode>);

impl LibraryEdges {
    pub(super) fn new(major: i32, on: bool) -> Self {
        let knob = std::env::var("FUSEC_LIBRARY_PDL").ok();
        let allowed = major >= 9 && knob.as_deref().map(str::trim) != Some("0");
        LibraryEdges { allowed, on: AtomicBool::new(on), ..Default::default() }
    }

    pub(super) fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// A capture begins: nothing made in it yet.
    pub(super) fn begin_capture(&self) {
        self.recapture.store(false, Ordering::Relaxed);
        self.made_names().clear();
    }

    /// Whether the graph just captured holds an edge into a kernel not known to wait.
    pub(super) fn recapture(&self) -> bool {
        self.recapture.load(Ordering::Relaxed)
    }

    /// Library kernels given a programmatic edge in the graph captured last.
    pub(super) fn made(&self) -> Vec<String> {
        self.made_names().clone()
    }

    fn made_names(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.made.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kernels to probe, with their steps' addresses (taken).
    pub(super) fn take_pending(&self) -> Vec<(String, usize)> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// No more library edges in this session.
    pub(super) fn refuse(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }

    /// Before a library call on `stream`: where a graph is being captured and everything the
    /// call will depend on is a kernel, makes those edges programmatic.
    pub(super) fn before(&self, stream: &CudaStream, step: &Loaded) -> Option<Primaries> {
        if !self.allowed || !self.on.load(Ordering::Relaxed) || self.refused.load(Ordering::Relaxed) {
            return None;
        }
        if self.plain_steps().contains(&key(step)) {
            return None;
        }
        programmatic_from_here(stream).map(Primaries)
    }

    fn plain_steps(&self) -> std::sync::MutexGuard<'_, HashSet<(usize, [u64; 8])>> {
        self.plain.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After the call of `step`: looks up what the programmatic edges reached. A kernel that
    /// does not wait (or anything but a kernel) keeps the step's edge plain with its algorithm,
    /// a failed call all of the session's; a kernel not known yet is left to probe; each asks
    /// for the graph to be captured again. Where the call captured nothing, the edges are made plain again, for whatever is
    /// captured next.
    pub(super) fn after(&self, stream: &CudaStream, primaries: Primaries, failed: bool, step: &Loaded) {
        let mut reached = Vec::new();
        let mut safe = !failed;
        let mut unknown = Vec::new();
        let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        for &node in &primaries.0 {
            for (dependent, _) in dependents(node).into_iter().filter(|(_, e)| e.type_ == programmatic) {
                let name = kernel_name(dependent);
                reached.push(name.clone().unwrap_or_default());
                let waits = name.as_deref().map_or(Some(false), verdict);
                tracing::debug!(
                    kernel = name.as_deref().unwrap_or("(not a kernel)"),
                    ?waits,
                    "library kernel given a programmatic edge"
                );
                match (waits, name) {
                    (Some(waits), _) => safe &= waits,
                    (None, Some(name)) => unknown.push((name, step as *const Loaded as usize)),
                    (None, None) => safe = false,
                }
            }
        }
        if reached.is_empty() && capture_dependencies(stream).is_some_and(|now| now == primaries.0) {
            set_dependencies(stream, &primaries.0, None);
        }
        if failed {
            self.refuse();
            self.recapture.store(true, Ordering::Relaxed);
        } else if !safe {
            self.plain_steps().insert(key(step));
            self.recapture.store(true, Ordering::Relaxed);
        } else if !unknown.is_empty() {
            self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(unknown);
            self.recapture.store(true, Ordering::Relaxed);
        } else {
            self.made_names().extend(reached);
        }
    }
}

/// What a step's verdict is kept by: its address and the algorithm its call runs.
fn key(step: &Loaded) -> (usize, [u64; 8]) {
    let algo = match step {
        Loaded::Gemm { lt: Some(prepared), on_cublas: false, .. } => super::lt::Lt::algo_key(prepared),
        _ => [0; 8],
    };
    (step as *const Loaded as usize, algo)
}

/// Where everything the next node captured on `stream` depends on is a kernel, makes those
/// edges programmatic; the nodes, or `None` (nothing changed).
pub(super) fn programmatic_from_here(stream: &CudaStream) -> Option<Vec<sys::CUgraphNode>> {
    let nodes = capture_dependencies(stream)?;
    let kernel =
        |n: &sys::CUgraphNode| node_type(*n) == Some(sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL);
    if nodes.is_empty() || !nodes.iter().all(kernel) {
        return None;
    }
    let edge = sys::CUgraphEdgeData {
        from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
        to_port: 0,
        type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        reserved: [0; 5],
    };
    set_dependencies(stream, &nodes, Some(&vec![edge; nodes.len()])).then_some(nodes)
}

/// The name of the kernel the nodes `primaries` reach through a programmatic edge (the first).
pub(super) fn reached_kernel(primaries: &[sys::CUgraphNode]) -> Option<String> {
    let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
    primaries
        .iter()
        .flat_map(|&node| dependents(node))
        .find(|(_, edge)| edge.type_ == programmatic)
        .and_then(|(node, _)| kernel_name(node))
}

/// The nodes the next node captured on `stream` will depend on; `None` where the stream is not
/// capturing.
fn capture_dependencies(stream: &CudaStream) -> Option<Vec<sys::CUgraphNode>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut nodes: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: every pointer is to a local the call writes; the arrays it returns are owned by
    // the capture and valid until the next call on the stream, and are copied at once.
    let status_ok = unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            &mut graph,
            &mut nodes,
            &mut edges,
            &mut count,
        )
    } == sys::CUresult::CUDA_SUCCESS;
    if !status_ok || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return None;
    }
    if count == 0 || nodes.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: the driver returned `count` nodes at `nodes`.
    Some(unsafe { std::slice::from_raw_parts(nodes, count) }.to_vec())
}

/// Sets what the next node captured on `stream` depends on, with `edges` (plain where `None`).
fn set_dependencies(
    stream: &CudaStream,
    nodes: &[sys::CUgraphNode],
    edges: Option<&[sys::CUgraphEdgeData]>,
) -> bool {
    let mut nodes = nodes.to_vec();
    let data = edges.map_or(std::ptr::null(), |e| e.as_ptr());
    // SAFETY: `nodes` and `data` hold `nodes.len()` entries each (or `data` is null) and are
    // read during the call only.
    let status = unsafe {
        sys::cuStreamUpdateCaptureDependencies_v2(
            stream.cu_stream(),
            nodes.as_mut_ptr(),
            data,
            nodes.len(),
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
        )
    };
    status == sys::CUresult::CUDA_SUCCESS
}

fn node_type(node: sys::CUgraphNode) -> Option<sys::CUgraphNodeType> {
    let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `node` belongs to the graph being captured; the call writes one value.
    let ok = unsafe { sys::cuGraphNodeGetType(node, &mut kind) } == sys::CUresult::CUDA_SUCCESS;
    ok.then_some(kind)
}

/// The nodes that depend on `node`, with their edges.
fn dependents(node: sys::CUgraphNode) -> Vec<(sys::CUgraphNode, sys::CUgraphEdgeData)> {
    let mut count = 0usize;
    // SAFETY: with null arrays the call writes the count only.
    let counted = unsafe {
        sys::cuGraphNodeGetDependentNodes_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut count)
    } == sys::CUresult::CUDA_SUCCESS;
    if !counted || count == 0 {
        return Vec::new();
    }
    let mut nodes = vec![std::ptr::null_mut(); count];
    let blank = sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] };
    let mut edges = vec![blank; count];
    // SAFETY: both arrays hold `count` entries, the number the driver gave.
    let ok = unsafe {
        sys::cuGraphNodeGetDependentNodes_v2(node, nodes.as_mut_ptr(), edges.as_mut_ptr(), &mut count)
    } == sys::CUresult::CUDA_SUCCESS;
    if !ok {
        return Vec::new();
    }
    nodes.into_iter().zip(edges).take(count).collect()
}

/// The name of a kernel node's function; `None` for another kind of node.
fn kernel_name(node: sys::CUgraphNode) -> Option<String> {
    if node_type(node) != Some(sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL) {
        return None;
    }
    // SAFETY: plain C struct of pointers and integers; zero is valid, and the call fills it.
    let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: `node` is a kernel node of the graph being captured.
    if unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) } != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the function (or kernel) handle comes from the driver; the name it returns is a
    // NUL-terminated string owned by the driver, copied at once.
    let ok = unsafe {
        if !params.func.is_null() {
            sys::cuFuncGetName(&mut name, params.func)
        } else {
            sys::cuKernelGetName(&mut name, params.kern)
        }
    } == sys::CUresult::CUDA_SUCCESS;
    if !ok || name.is_null() {
        return None;
    }
    // SAFETY: as above.
    Some(unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::library_kernel_waits;

    #[test]
    fn only_hopper_xmma_gemms_are_known_to_wait() {
        assert!(library_kernel_waits(
            "sm90_xmma_gemm_f16f16_f16f32_f32_nt_n_tilesize64x128x64_cgasize1x1x1_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
        ));
        // Older kernels (no wait in their code) and a split-K reduction are not.
        assert!(!library_kernel_waits(
            "_Z18sgemm_largek_lds64ILb1ELb1ELi5ELi5ELi4ELi4ELi4ELi34EEvPfPKfS2_iiiiiiS2_S2_ffiiPiS3_"
        ));
        assert!(!library_kernel_waits("_ZN8internal5gemvx6kernelIiiN3__half"));
        assert!(!library_kernel_waits("cublasLt_splitKreduce_kernel"));
    }
}
