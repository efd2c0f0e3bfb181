// A decoding step's chain of dependent products with each phase's weights staged in shared
// memory before its wait (benches/NOTES.md, thirty-fifth session), beside the chain's kernel as
// `chain.cu` runs it, and a timeline of every phase from one replay. The shapes are those of
// `chain.cu` (GPT-2 small at batch 1: 73 phases, or TWO=1 a layer in two: 25; TINY=1 98 KB a
// phase); each variant prints its median and a digest of the last output (the same bits in
// every variant, and as `chain.cu`'s).
//   - regs:   a phase's kernel as in `chain.cu`: a warp's first PRE items in registers before
//             the wait, items spread over the grid a warp at a time;
//   - staged: a block's items contiguous, the first CAP bytes of them copied into shared
//             memory by one bulk copy before the wait, the rest read after it; with CAP small
//             enough, two blocks a multiprocessor (this phase's and the next one's);
//   - each also with the input's loads at once (a thread's loads of every partial issued
//             before the first is added) and, staged, four items a warp summed together.
// The timeline (globaltimer, ns, per block: start, the wait's end, the input's sum read, the
// staged weights arrived, the end) says whether a phase's blocks start before the phase
// before it ends, and what a phase costs after its wait. Compile-time sizes: -DTHREADS_=512
// -DPRE_=2 -DCAP_=98304.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common.cuh"

#ifndef THREADS_
#define THREADS_ 512
#endif
#ifndef PRE_
#define PRE_ 2
#endif
#ifndef CAP_
#define CAP_ 98304
#endif
constexpr int THREADS = THREADS_;
constexpr int WARPS = THREADS / 32;
constexpr int ITEM = CHUNK * 2;  // bytes of an item
constexpr int PRE = PRE_;
constexpr int MARKS = 5;


__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Thread 0 of a block records mark m of phase `ph`.
__device__ __forceinline__ void mark(unsigned long long* trace, int ph, int m) {
  if (trace && threadIdx.x == 0) trace[((size_t)ph * gridDim.x + blockIdx.x) * MARKS + m] = now();
}

// Item `it` of the phase (its output and partial) through the shared dot product.
__device__ __forceinline__ void dot_item(const Phase& p, const float* xs, int it, const uint4 (&w)[VEC]) {
  const int chunks = p.k / CHUNK;
  dot_item(p, xs, it / chunks, it % chunks, w);
}

__device__ __forceinline__ void load_row(const uint4* row, uint4 (&w)[VEC]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int v = 0; v < VEC; v++) w[v] = __ldg(row + v * 32 + lane);
}

// The input's partials summed into shared memory: with FAST, a thread's loads (up to 8
// partials of two elements, three times at most) issued before the first is added; else a
// partial at a time.
template <bool FAST = false>
__device__ __forceinline__ void read_x(const Phase& p, float* xs) {
  if (FAST && p.xchunks <= 8 && p.k <= 6 * THREADS) {
#pragma unroll
    for (int i0 = 0; i0 < 6; i0 += 2) {
      if (i0 * THREADS >= p.k) break;
      float v[8][2];
#pragma unroll
      for (int c = 0; c < 8; c++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
          const int k = threadIdx.x + (i0 + i) * THREADS;
          v[c][i] = c < p.xchunks && k < p.k ? __ldcg(p.x + (size_t)c * p.k + k) : 0.f;
        }
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int k = threadIdx.x + (i0 + i) * THREADS;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < 8; c++) s += v[c][i];
        if (k < p.k) xs[k] = s;
      }
    }
  } else {
    for (int k = threadIdx.x; k < p.k; k += THREADS) {
      float s = 0.f;
      for (int c = 0; c < p.xchunks; c++) s += __ldcg(p.x + (size_t)c * p.k + k);
      xs[k] = s;
    }
  }
  __syncthreads();
}

// Items j0, j0 + WARPS, ... (up to G of them) of a block's staged items summed together: their
// loads, products and warp sums interleaved.
template <int G>
__device__ __forceinline__ void dot_items(const Phase& p, const float* xs, const char* ws, int first, int j0, int count) {
  const int chunks = p.k / CHUNK, lane = threadIdx.x % 32;
  float s[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
    s[g] = 0.f;
    const int j = j0 + g * WARPS;
    if (j >= count) continue;
    const int c = (first + j) % chunks;
    const uint4* row = reinterpret_cast<const uint4*>(ws + (size_t)j * ITEM);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
      const uint4 w = row[v * 32 + lane];
      const __half2* h = reinterpret_cast<const __half2*>(&w);
      const float4* xv = reinterpret_cast<const float4*>(xs + c * CHUNK + (v * 32 + lane) * 8);
      const float4 a = xv[0], b = xv[1];
      const float2 f0 = __half22float2(h[0]), f1 = __half22float2(h[1]), f2 = __half22float2(h[2]), f3 = __half22float2(h[3]);
      s[g] += f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w + f2.x * b.x + f2.y * b.y + f3.x * b.z + f3.y * b.w;
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1)
#pragma unroll
    for (int g = 0; g < G; g++) s[g] += __shfl_xor_sync(0xffffffff, s[g], o);
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < G; g++) {
      const int j = j0 + g * WARPS;
      if (j < count) p.y[(size_t)((first + j) % chunks) * p.n + (first + j) / chunks] = s[g];
    }
}

// The flags of `FLAGS` phases: a phase's blocks each add one to its flag after their stores
// (release); a phase waits for the flag of the phase before to reach its grid (acquire) instead of
// `griddepcontrol.wait`, which waits for the grid's end and its memory flush. A phase resets the
// flag of the phase two before it (whose readers have all passed), the first phase the last two.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* f) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
  return v;
}
__device__ __forceinline__ void flag_wait(unsigned* flags, int ph, int count) {
  if (threadIdx.x == 0) {
    if (ph > 0) while (ld_acquire(flags + ph - 1) < gridDim.x) {}
    if (blockIdx.x == 0) {
      if (ph >= 2) flags[ph - 2] = 0;
      if (ph == 0) { flags[count - 1] = 0; flags[count - 2] = 0; }
    }
  }
  __syncthreads();
}
__device__ __forceinline__ void flag_done(unsigned* flags, int ph) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(flags + ph) : "memory");
}

// `chain.cu`'s kernel: a warp's first PRE items (spread over the grid) in registers before the
// wait, the next kernel let scheduled at the start. With `flags`, the wait is on the flag of the
// phase before (`flag_wait`) rather than on its grid.
template <bool FAST>
__global__ void __launch_bounds__(THREADS, 2) regs_kernel(Phase p, int ph, unsigned long long* trace, unsigned* flags = nullptr, int count = 0) {
  extern __shared__ float xs[];
  mark(trace, ph, 0);
  launch_dep();
  const int warp = threadIdx.x / 32, items = items_of(p);
  const int gw = blockIdx.x * WARPS + warp, tw = gridDim.x * WARPS;
  uint4 pre[PRE][VEC];
#pragma unroll
  for (int i = 0; i < PRE; i++)
    if (gw + i * tw < items) load_row(reinterpret_cast<const uint4*>(p.w) + (size_t)(gw + i * tw) * (ITEM / 16), pre[i]);
  if (flags) flag_wait(flags, ph, count);
  else wait_dep();
  mark(trace, ph, 1);
  read_x<FAST>(p, xs);
  mark(trace, ph, 2);
#pragma unroll
  for (int i = 0; i < PRE; i++)
    if (gw + i * tw < items) dot_item(p, xs, gw + i * tw, pre[i]);
  mark(trace, ph, 3);
  for (int it = gw + PRE * tw; it < items; it += tw) {
    uint4 w[VEC];
    load_row(reinterpret_cast<const uint4*>(p.w) + (size_t)it * (ITEM / 16), w);
    dot_item(p, xs, it, w);
  }
  if (flags) flag_done(flags, ph);
  else __syncthreads();
  mark(trace, ph, 4);
}

// A block's items contiguous; the first `cap` bytes of them in shared memory by one bulk copy
// issued before the wait.
template <bool FAST>
__global__ void __launch_bounds__(THREADS, 2) staged_kernel(Phase p, int ph, unsigned long long* trace, int cap) {
  extern __shared__ __align__(128) char smem[];
  float* xs = reinterpret_cast<float*>(smem);
  char* ws = smem + XS_MAX * 4;
  unsigned long long* bar = reinterpret_cast<unsigned long long*>(ws + cap);
  mark(trace, ph, 0);
  launch_dep();
  const int warp = threadIdx.x / 32, items = items_of(p);
  const int per = (items + gridDim.x - 1) / gridDim.x;
  const int first = min(blockIdx.x * per, items), last = min(first + per, items);
  const int staged = min(last - first, cap / ITEM);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const unsigned bytes = staged * ITEM;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(bar)), "r"(bytes) : "memory");
    if (bytes)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(saddr(ws)), "l"(p.w + (size_t)first * CHUNK), "r"(bytes), "r"(saddr(bar)) : "memory");
  }
  wait_dep();
  mark(trace, ph, 1);
  read_x<FAST>(p, xs);  // its __syncthreads also publishes the barrier's initialisation
  mark(trace, ph, 2);
  unsigned ok = 0;
  do {
    asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], 0; selp.u32 %0, 1, 0, q; }"
                 : "=r"(ok) : "r"(saddr(bar)) : "memory");
  } while (!ok);
  mark(trace, ph, 3);
  int from = warp;
  if (FAST) {
    // The staged items four at a time a warp, then the rest.
    for (; from < staged; from += 4 * WARPS) dot_items<4>(p, xs, ws, first, from, staged);
    from = staged + warp;
  }
  for (int j = from; j < last - first; j += WARPS) {
    uint4 w[VEC];
    if (j < staged) {
      const uint4* row = reinterpret_cast<const uint4*>(ws + (size_t)j * ITEM);
#pragma unroll
      for (int v = 0; v < VEC; v++) w[v] = row[v * 32 + threadIdx.x % 32];
    } else {
      load_row(reinterpret_cast<const uint4*>(p.w) + (size_t)(first + j) * (ITEM / 16), w);
    }
    dot_item(p, xs, first + j, w);
  }
  __syncthreads();
  mark(trace, ph, 4);
}


struct Shape { int n, k; };

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, sms);
  std::vector<Shape> shapes;
  const bool two = getenv("TWO") != nullptr;
  for (int l = 0; l < 12; l++) {
    if (two) {
      shapes.push_back({3840, 768});
      shapes.push_back({6144, 768});
    } else {
      for (Shape s : {Shape{2304, 768}, {64, 768}, {768, 768}, {768, 768}, {3072, 768}, {768, 3072}}) shapes.push_back(s);
    }
  }
  shapes.push_back({50257, 768});
  if (getenv("TINY")) for (auto& s : shapes) s = {64, 768};
  size_t wbytes = 0;
  std::vector<__half*> ws;
  for (auto s : shapes) {
    __half* w;
    CK(cudaMalloc(&w, (size_t)s.n * s.k * 2));
    fill<<<256, 256>>>(w, (size_t)s.n * s.k, (unsigned)ws.size());
    ws.push_back(w);
    wbytes += (size_t)s.n * s.k * 2;
  }
  std::vector<float*> acts(shapes.size() + 1);
  for (auto& a : acts) { CK(cudaMalloc(&a, 4 * 50257 * 4)); CK(cudaMemset(a, 0, 4 * 50257 * 4)); }
  fillf<<<1, 256>>>(acts[0], 4 * 50257);
  std::vector<Phase> ps;
  int xch = 1;
  for (size_t i = 0; i < shapes.size(); i++) {
    ps.push_back(Phase{ws[i], acts[i], acts[i + 1], shapes[i].n, shapes[i].k, xch});
    xch = two ? shapes[i].n / CHUNK : shapes[i].k / CHUNK;
  }
  const int count = (int)ps.size(), grid = sms;
  unsigned long long* trace;
  CK(cudaMalloc(&trace, (size_t)count * grid * MARKS * 8));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto timeit = [&](auto fn, int iters) { return median_ms(st, fn, iters); };
  {
    void *ca, *cb;
    size_t cbytes = 256 << 20;
    CK(cudaMalloc(&ca, cbytes)); CK(cudaMalloc(&cb, cbytes));
    float cms = timeit([&] { CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, st)); }, 50);
    double rate = cbytes / (cms * 1e-3);
    printf("copy rate %.0f GB/s; weights %.1f MB in %d phases; floor %.4f ms\n", rate / 1e9, wbytes / 1e6, count,
           wbytes / rate * 1e3);
    CK(cudaFree(ca)); CK(cudaFree(cb));
  }
  // Times the graph of a variant's launches, then one traced replay: per phase, the first
  // block's start and the medians of the marks, against the end of the phase before.
  auto run = [&](const char* name, auto launch) {
    auto record = [&](unsigned long long* tr) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < count; i++) launch(i, tr);
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphDestroy(g));
      return ge;
    };
    cudaGraphExec_t plain = record(nullptr), traced = record(trace);
    float ms = timeit([&] { CK(cudaGraphLaunch(plain, st)); }, 200);
    float tms = timeit([&] { CK(cudaGraphLaunch(traced, st)); }, 20);
    printf("%-44s %.4f ms (traced %.4f); %s\n", name, ms, tms, digest(st, acts.back()).c_str());
    std::vector<unsigned long long> h((size_t)count * grid * MARKS);
    CK(cudaMemcpy(h.data(), trace, h.size() * 8, cudaMemcpyDeviceToHost));
    auto at = [&](int ph, int b, int m) { return (double)h[((size_t)ph * grid + b) * MARKS + m]; };
    double t0 = 1e300;
    for (int b = 0; b < grid; b++) t0 = std::min(t0, at(0, b, 0));
    // Sums over the phases after the first: where each mark's median lies after the phase
    // before ended (its last block's end), and how many blocks started before that end.
    double sum_first = 0, sum_wait = 0, sum_x = 0, sum_w = 0, sum_end = 0, early = 0;
    double prev_end = 0;
    for (int ph = 0; ph < count; ph++) {
      std::vector<double> m[MARKS];
      double end = 0, start = 1e300;
      for (int b = 0; b < grid; b++) {
        for (int k = 0; k < MARKS; k++) m[k].push_back(at(ph, b, k) - t0);
        end = std::max(end, at(ph, b, 4) - t0);
        start = std::min(start, at(ph, b, 0) - t0);
      }
      for (auto& v : m) std::sort(v.begin(), v.end());
      auto med = [&](int k) { return m[k][grid / 2]; };
      if (ph > 0) {
        sum_first += start - prev_end;
        sum_wait += med(1) - prev_end;
        sum_x += med(2) - prev_end;
        sum_w += med(3) - prev_end;
        sum_end += end - prev_end;
        for (int b = 0; b < grid; b++) early += at(ph, b, 0) - t0 < prev_end;
      }
      if (getenv("PHASES") && ph >= 24 && ph < 24 + (two ? 3 : 7))
        printf("  phase %2d (%5d x %4d): first start %+7.0f, medians: start %+7.0f wait %+7.0f x %+7.0f w %+7.0f end %+7.0f, last end %+7.0f ns\n",
               ph, ps[ph].n, ps[ph].k, start - prev_end, med(0) - prev_end, med(1) - prev_end, med(2) - prev_end,
               med(3) - prev_end, med(4) - prev_end, end - prev_end);
      prev_end = end;
    }
    const double n = count - 1;
    printf("  mean over phases, ns after the phase before ended: first start %+.0f; medians: wait %+.0f, x read %+.0f, weights %+.0f; last end %+.0f; blocks started before it %.0f%%\n",
           sum_first / n, sum_wait / n, sum_x / n, sum_w / n, sum_end / n, 100 * early / (n * grid));
    CK(cudaGraphExecDestroy(plain));
    CK(cudaGraphExecDestroy(traced));
  };
  auto config = [&](size_t smem, cudaLaunchAttribute* at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid; cfg.blockDim = THREADS; cfg.dynamicSmemBytes = smem; cfg.stream = st;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = 1;
    return cfg;
  };
  const size_t xsb = XS_MAX * 4;
  CK(cudaFuncSetAttribute(regs_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  CK(cudaFuncSetAttribute(regs_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  CK(cudaFuncSetAttribute(staged_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 << 10));
  CK(cudaFuncSetAttribute(staged_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 << 10));
  run("regs (chain.cu's kernel)", [&](int i, unsigned long long* tr) {
    cudaLaunchAttribute at[1];
    auto cfg = config(xsb, at);
    CK(cudaLaunchKernelEx(&cfg, regs_kernel<false>, ps[i], i, tr, (unsigned*)nullptr, 0));
  });
  run("regs, the input's loads at once", [&](int i, unsigned long long* tr) {
    cudaLaunchAttribute at[1];
    auto cfg = config(xsb, at);
    CK(cudaLaunchKernelEx(&cfg, regs_kernel<true>, ps[i], i, tr, (unsigned*)nullptr, 0));
  });
  unsigned* flags;
  CK(cudaMalloc(&flags, count * 4));
  CK(cudaMemset(flags, 0, count * 4));
  for (int fast = 0; fast < 2; fast++)
    run(fast ? "regs, flags, the input's loads at once" : "regs, flags (no griddepcontrol.wait)", [&](int i, unsigned long long* tr) {
      cudaLaunchAttribute at[1];
      auto cfg = config(xsb, at);
      CK(cudaLaunchKernelEx(&cfg, fast ? regs_kernel<true> : regs_kernel<false>, ps[i], i, tr, flags, count));
    });
  if (getenv("FLAGS_ONLY")) return 0;
  run("regs, one block a multiprocessor (smem)", [&](int i, unsigned long long* tr) {
    cudaLaunchAttribute at[1];
    auto cfg = config(160 << 10, at);
    CK(cudaLaunchKernelEx(&cfg, regs_kernel<false>, ps[i], i, tr, (unsigned*)nullptr, 0));
  });
  for (int fast = 0; fast < 2; fast++)
    for (int cap : {CAP_, 2 * CAP_}) {
      char name[64];
      snprintf(name, 64, "staged, %d KB (%s)%s", cap >> 10, cap <= (100 << 10) ? "two blocks an SM" : "one",
               fast ? ", loads at once" : "");
      run(name, [&](int i, unsigned long long* tr) {
        cudaLaunchAttribute at[1];
        auto cfg = config(xsb + cap + 16, at);
        CK(cudaLaunchKernelEx(&cfg, fast ? staged_kernel<true> : staged_kernel<false>, ps[i], i, tr, cap));
      });
    }
  return 0;
}
