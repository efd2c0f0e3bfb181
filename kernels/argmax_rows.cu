// The index of each row's largest value (the first of equals; NaNs never win; 0 for a row of
// NaNs or -inf): greedy decoding's choice, so that only token ids leave the GPU. A row is
// split over the blocks of `gridDim.x` (chunks of `blockDim.x * items` values), so that
// one row of a vocabulary still spreads over the GPU; each block's best is one 64-bit key (the
// value's order bits over the index's complement: the larger key is the larger value, then the
// smaller index) merged into the row's slot of `scratch` by atomicMax, and the row's last
// block to finish (counted in the slot's second word) writes the id and clears the slot for
// the next launch. `scratch` is 2 words a row, zero before the first launch.
// The runtime loads the PTX beside it (kernels/argmax_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.

#include "copy_rows.cuh"

// Most values a thread takes (`items`, an argument: all its loads issued before any is compared).
#define ARGMAX_ITEMS 16

// The key of value `v` at index `i` (`i` < 2^32): NaN as -inf, -0 as +0, so that keys order as
// `v > best` with the first of equals does.
__device__ __forceinline__ unsigned long long argmax_key(float v, unsigned int i) {
    unsigned int u = __float_as_uint(v);
    if (v != v) u = 0xff800000u;
    if (v == 0.0f) u = 0u;
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffu - i);
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long key) {
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, key, o);
        key = other > key ? other : key;
    }
    return key;
}

// Row `row`'s chunk `chunk` of `chunks`; the id goes to `out[row]` and, where `host` is not
// null, `host[row]` (page-locked host memory mapped for the device).
__device__ __forceinline__ void argmax_chunk(const float* __restrict__ x, long long* __restrict__ out,
                                             unsigned long long width, unsigned long long* __restrict__ scratch,
                                             long long* host, unsigned long long row, unsigned long long chunk_index,
                                             unsigned long long chunks, unsigned long long items) {
    const float* values = x + row * width;
    const unsigned long long chunk = (unsigned long long)blockDim.x * items;
    const unsigned long long first = chunk_index * chunk + threadIdx.x;
    float v[ARGMAX_ITEMS];
#pragma unroll
    for (int k = 0; k < ARGMAX_ITEMS; ++k) {
        const unsigned long long i = first + (unsigned long long)k * blockDim.x;
        v[k] = k < items && i < width ? values[i] : __int_as_float(0xff800000);
    }
    // To start: -inf past every index, which any value of the row beats.
    unsigned long long key = argmax_key(__int_as_float(0xff800000), 0xffffffffu);
#pragma unroll
    for (int k = 0; k < ARGMAX_ITEMS; ++k) {
        const unsigned long long i = first + (unsigned long long)k * blockDim.x;
        const unsigned long long candidate = argmax_key(v[k], (unsigned int)i);
        if (k < items && i < width && candidate > key) key = candidate;
    }
    key = warp_max(key);
    __shared__ unsigned long long keys[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) keys[warp] = key;
    __syncthreads();
    if (warp != 0) return;
    key = warp_max(lane < warps ? keys[lane] : 0ull);
    if (lane != 0) return;
    unsigned long long* slot = scratch + 2 * row;
    atomicMax(slot, key);
    __threadfence();
    const unsigned long long done = atomicAdd(slot + 1, 1ull);
    if (done + 1 != chunks) return;
    // Every block's key is in: the last one takes the row's and clears the slot.
    __threadfence();
    const unsigned long long best = atomicExch(slot, 0ull);
    slot[1] = 0ull;
    const long long id = (long long)(0xffffffffu - (unsigned int)(best & 0xffffffffull));
    out[row] = id;
    if (host != nullptr) host[row] = id;
}

// Row `blockIdx.y`'s chunk `blockIdx.x`, `items` (at most ARGMAX_ITEMS) values a thread.
extern "C" __global__ void fusec_argmax_rows(const float* __restrict__ x, long long* __restrict__ out,
                                             unsigned long long width, unsigned long long* __restrict__ scratch,
                                             long long* host, unsigned long long items) {
    argmax_chunk(x, out, width, scratch, host, blockIdx.y, blockIdx.x, gridDim.x, items);
}

// A decoding step's greedy choice and the copies after it in one launch (one launch's wait
// the fewer a step): rows `blockIdx.y < rows` are the choice's (their first `chunks` blocks),
// the others `copy_rows_block`'s tensors and column sets (`copy_rows.cu`), which neither read
// nor write what the choice does.
extern "C" __global__ void fusec_argmax_rows_copying(const float* __restrict__ x, long long* __restrict__ out,
                                                     unsigned long long width,
                                                     unsigned long long* __restrict__ scratch, long long* host,
                                                     unsigned long long rows, unsigned long long chunks,
                                                     unsigned long long items,
                                                     const unsigned long long* __restrict__ sources,
                                                     const unsigned long long* __restrict__ targets,
                                                     unsigned long long copy_rows, unsigned long long words,
                                                     unsigned long long src_pitch, unsigned long long dst_pitch,
                                                     unsigned long long src_offset, unsigned long long dst_offset,
                                                     unsigned long long tensors, unsigned long long wide, ColumnSet s0,
                                                     ColumnSet s1, unsigned long long copy_blocks) {
    if (blockIdx.y < rows) {
        if (blockIdx.x < chunks) argmax_chunk(x, out, width, scratch, host, blockIdx.y, blockIdx.x, chunks, items);
        return;
    }
    if (blockIdx.x < copy_blocks)
        copy_rows_block(sources, targets, copy_rows, words, src_pitch, dst_pitch, src_offset, dst_offset, tensors,
                        wide, s0, s1, blockIdx.y - rows, blockIdx.x);
}
