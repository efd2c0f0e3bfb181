// The index of each row's largest value (the first of equals; NaNs never win; 0 for a row of
// NaNs or -inf): one block a row. Greedy decoding's choice, so that only token ids leave the GPU.
// The runtime loads the PTX beside it (kernels/argmax_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.

// The warp's largest value and its index (the smaller index of equals), in every lane.
__device__ __forceinline__ void warp_argmax(float& best, unsigned long long& at) {
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const unsigned long long a = __shfl_xor_sync(0xffffffffu, at, o);
        if (v > best || (v == best && a < at)) {
            best = v;
            at = a;
        }
    }
}

extern "C" __global__ void fusec_argmax_rows(const float* __restrict__ x, long long* __restrict__ out,
                                             unsigned long long width) {
    const float* row = x + (unsigned long long)blockIdx.x * width;
    float best = __int_as_float(0xff800000);
    unsigned long long at = 0;
    for (unsigned long long i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = row[i];
        if (v > best) {
            best = v;
            at = i;
        }
    }
    // A thread that saw no larger value than -inf keeps index 0 only if it is thread 0's.
    if (!(best > __int_as_float(0xff800000)) && threadIdx.x != 0) at = ~0ull;
    warp_argmax(best, at);
    __shared__ float values[32];
    __shared__ unsigned long long indices[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        values[warp] = best;
        indices[warp] = at;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < warps ? values[lane] : __int_as_float(0xff800000);
        at = lane < warps ? indices[lane] : ~0ull;
        warp_argmax(best, at);
        if (lane == 0) out[blockIdx.x] = at == ~0ull ? 0 : (long long)at;
    }
}
