// The index of each row's largest value (the first of equals; NaNs never win; 0 for a row of
// NaNs or -inf): greedy decoding's choice, so that only token ids leave the GPU. A row is
// split over the blocks of `gridDim.x` (chunks of `blockDim.x * ARGMAX_ITEMS` values), so that
// one row of a vocabulary still spreads over the GPU; each block's best is one 64-bit key (the
// value's order bits over the index's complement: the larger key is the larger value, then the
// smaller index) merged into the row's slot of `scratch` by atomicMax, and the row's last
// block to finish (counted in the slot's second word) writes the id and clears the slot for
// the next launch. `scratch` is 2 words a row, zero before the first launch.
// The runtime loads the PTX beside it (kernels/argmax_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.

#define ARGMAX_ITEMS 4

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

// Row `blockIdx.y`'s chunk `blockIdx.x`; the id goes to `out[row]` and, where `host` is not
// null, `host[row]` (page-locked host memory mapped for the device).
extern "C" __global__ void fusec_argmax_rows(const float* __restrict__ x, long long* __restrict__ out,
                                             unsigned long long width, unsigned long long* __restrict__ scratch,
                                             long long* host) {
    const unsigned long long row = blockIdx.y;
    const float* values = x + row * width;
    const unsigned long long chunk = (unsigned long long)blockDim.x * ARGMAX_ITEMS;
    const unsigned long long first = (unsigned long long)blockIdx.x * chunk + threadIdx.x;
    float v[ARGMAX_ITEMS];
#pragma unroll
    for (int k = 0; k < ARGMAX_ITEMS; ++k) {
        const unsigned long long i = first + (unsigned long long)k * blockDim.x;
        v[k] = i < width ? values[i] : __int_as_float(0xff800000);
    }
    // To start: -inf past every index, which any value of the row beats.
    unsigned long long key = argmax_key(__int_as_float(0xff800000), 0xffffffffu);
#pragma unroll
    for (int k = 0; k < ARGMAX_ITEMS; ++k) {
        const unsigned long long i = first + (unsigned long long)k * blockDim.x;
        const unsigned long long candidate = argmax_key(v[k], (unsigned int)i);
        if (i < width && candidate > key) key = candidate;
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
    if (done + 1 != gridDim.x) return;
    // Every block's key is in: the last one takes the row's and clears the slot.
    __threadfence();
    const unsigned long long best = atomicExch(slot, 0ull);
    slot[1] = 0ull;
    const long long id = (long long)(0xffffffffu - (unsigned int)(best & 0xffffffffull));
    out[row] = id;
    if (host != nullptr) host[row] = id;
}
