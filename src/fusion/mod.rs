//! Fusion by equality saturation (egg): recognises LayerNorm, GELU, softmax and attention in
//! the IR's primitives, extracts the cheapest form under a cost model (HBM bytes moved plus a
//! per-launch cost), and partitions the graph into kernels. Knows nothing of CUDA.
