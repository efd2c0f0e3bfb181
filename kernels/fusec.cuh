// Device code shared by every generated kernel. NVRTC compiles it without the C++ standard
// library: only CUDA's built-in math functions are used.
#pragma once

// Where a kernel reports an index outside its axis (a gather's): a word of page-locked host
// memory mapped for the device, which the session points this at when it loads a module that
// reads it, and reads after each run; null (nothing reported) where no session set it. A report
// is one 64-bit store: the node's code above bit 40, the index as read in the 40 bits below.
extern "C" {
__device__ unsigned long long* fusec_index_faults;
}

namespace fusec {

// Index `k` of an axis of `size` (negative: from the end, as ONNX's gathers count): where it is
// still outside the axis, `node` (the gathering node's code in the bundle's table of checks) is
// reported and 0 read instead, so that no read leaves the table.
__device__ __forceinline__ long long checked_index(long long k, long long size, unsigned int node) {
    const long long read = k;
    if (k < 0) k += size;
    if ((unsigned long long)k >= (unsigned long long)size) {
        unsigned long long* faults = fusec_index_faults;
        if (faults != nullptr) {
            // An index that 40 bits cannot hold is reported as -2^39 ("beyond").
            const long long limit = 1LL << 39;
            const long long shown = read >= limit || read < -limit ? -limit : read;
            *(volatile unsigned long long*)faults =
                ((unsigned long long)node << 40) | ((unsigned long long)shown & ((1ULL << 40) - 1));
        }
        k = 0;
    }
    return k;
}

// Programmatic dependent launch (sm_90 and later). A kernel launched with programmatic stream
// serialization may be scheduled while the kernel before it in the stream is finishing; every
// generated kernel calls this first, before it reads or writes memory the kernel before may
// write: it lets the next kernel be scheduled, then waits until the kernel before has
// completed and its writes are visible. Letting the next one be scheduled before the wait
// is safe (it waits for this kernel's completion in turn) and gives it a kernel's time to be
// scheduled and to request what it reads first; `FUSEC_TRIGGER_AFTER_WAIT` (the knob
// `FUSEC_PDL_EARLY_TRIGGER=0`) lets it be scheduled only after the wait, for measuring.
// Launched without the attribute (or before sm_90), both instructions are no-ops.
__device__ __forceinline__ void grid_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef FUSEC_TRIGGER_AFTER_WAIT
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#endif
}

// `p`, which the compiler must take as changed here. Called right after `grid_begin` on each
// pointer the kernel before may have written: LLVM may move a read through a `__restrict__`
// pointer above inline assembly that does not name it (the wait's "memory" clobber does not
// hold it back), which would read the kernel before's output before it is complete.
template <typename T>
__device__ __forceinline__ T* after_wait(T* p) {
    asm volatile("" : "+l"(p));
    return p;
}

// Asks L2 for `bytes` from `base`, every thread of the grid a share of the 128-byte lines,
// without waiting for them: a kernel for a few rows fetching the next product's weights while
// its own are read, so that they are in L2 when that product runs.
__device__ __forceinline__ void prefetch_l2(const void* base, unsigned long long bytes) {
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x * 128ull;
    for (unsigned long long o = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * 128ull; o < bytes;
         o += step)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(base) + o));
}

// `N` consecutive elements, aligned for one vector load or store of their size (≤ 16 bytes).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

// A compile-time integer passed as a value (to a generic lambda that specialises on it).
template <int N>
struct Constant {
    static constexpr int value = N;
};

// `*p` where `inside`, else a pack of zeros (a window's padding).
template <typename P>
__device__ __forceinline__ P load_or_zero(const P* p, bool inside) {
    P v{};
    if (inside) v = *p;
    return v;
}

__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float nan() { return __int_as_float(0x7fc00000); }

// 2^x as the one multi-function instruction, results below f32's normal range flushed to zero
// (exp2f also scales such inputs around it: two multiplies and a compare more). For softmax
// weights, which half-type products then read, where a weight under 1e-38 is a zero anyway.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float relu(float x) { return x > 0.0f ? x : 0.0f; }
// The remainder with the divisor's sign (ONNX Mod with fmod=0, Python's %).
// C's fmod moved by one divisor where the signs differ, a zero taking the divisor's sign.
__device__ __forceinline__ float floor_mod(float a, float b) {
    const float r = fmodf(a, b);
    if (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) return r + b;
    return r == 0.0f ? copysignf(0.0f, b) : r;
}
__device__ __forceinline__ long long floor_mod(long long a, long long b) {
    const long long r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ long long relu(long long x) { return x > 0 ? x : 0; }

// Exact GELU: x/2 (1 + erf(x/√2)).
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }

// GELU's tanh approximation (GPT-2's gelu_new).
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
}

// numpy-style min/max that keep a NaN.
__device__ __forceinline__ float minimum(float a, float b) { return (a != a || b != b) ? nan() : fminf(a, b); }
__device__ __forceinline__ float maximum(float a, float b) { return (a != a || b != b) ? nan() : fmaxf(a, b); }
__device__ __forceinline__ long long minimum(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long maximum(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ int minimum(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int maximum(int a, int b) { return a > b ? a : b; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum and maximum over each group of `N` lanes (a power of two under 32) of a warp; every
// lane of the group gets its group's result.
template <int N>
__device__ __forceinline__ float lanes_sum(float v) {
    for (int o = N / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <int N>
__device__ __forceinline__ float lanes_max(float v) {
    for (int o = N / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// Maximum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : -inf();
    return warp_max(v);
}

// Asynchronous 16-byte copies from device memory into shared memory (sm_80+), in groups:
// `cp_async_wait<N>` returns once at most N of this thread's committed groups are pending.
__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(global));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Thread-block clusters (sm_90+, a kernel declared with `FUSEC_CLUSTER_DIMS(n)`): this block's
// rank in its cluster; a barrier of every thread of the cluster, shared-memory writes before it
// visible to the cluster's reads after it; the address of `p` (this block's shared memory) in
// the shared memory of the cluster's block `rank`, read there with ordinary loads. Compiled
// for an earlier arch, `FUSEC_CLUSTERS` is 0 and a kernel takes another way (no clusters).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FUSEC_CLUSTERS 1
#define FUSEC_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// The two halves of `cluster_sync`, for work between them: this thread's arrival (its memory
// operations before it made visible to the cluster), then the wait for every thread's.
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
template <typename T>
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
    unsigned long long to;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(to) : "l"(reinterpret_cast<unsigned long long>(p)), "r"(rank));
    return reinterpret_cast<const T*>(to);
}
#else
#define FUSEC_CLUSTERS 0
#define FUSEC_CLUSTER_DIMS(n)
#endif

// Two 8×8 matrices of 16-bit elements from shared memory, transposed: lanes 0–7 address the
// rows of the first, lanes 8–15 those of the second (16-byte aligned); lane L receives rows
// 2(L%4) and 2(L%4)+1 of column L/4 — a column-major mma B fragment of a row-major tile.
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned& r0, unsigned& r1, const void* shared) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(at));
}

// Four 8×8 matrices, lanes 8i to 8i+7 addressing the rows of matrix i; lane L receives row
// L/4, columns 2(L%4) and 2(L%4)+1 of each — a row-major tile's rows as the columns of mma B
// fragments (`_x2`: the first two, addressed by lanes 0–15). `_trans`: transposed, as above.
__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* shared) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(at));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned& r0, unsigned& r1, const void* shared) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(at));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* shared) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(at));
}

// Tensor-core helpers for kernels on half types (included after cuda_fp16.h / cuda_bf16.h).
// `mma_m16n8k16` is one warp-wide D = A·B + D with A 16×16 (row-major, four registers of two
// halves), B 16×8 (column-major, two registers) and D 16×8 in f32 (four floats a thread).
#if defined(__CUDA_FP16_H__)
__device__ __forceinline__ unsigned pack2(float lo, float hi, __half) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
}
// Two halves of a 32-bit word as floats (the low one first).
__device__ __forceinline__ float2 unpack2(unsigned w, __half) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
__device__ __forceinline__ void mma_m16n8k16(float* d, const unsigned* a, unsigned b0, unsigned b1, __half) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
#if defined(__CUDA_BF16_H__)
__device__ __forceinline__ unsigned pack2(float lo, float hi, __nv_bfloat16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
}
__device__ __forceinline__ float2 unpack2(unsigned w, __nv_bfloat16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
__device__ __forceinline__ void mma_m16n8k16(float* d, const unsigned* a, unsigned b0, unsigned b1, __nv_bfloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

}  // namespace fusec
