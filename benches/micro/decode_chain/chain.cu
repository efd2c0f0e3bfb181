// A decoding step's chain of dependent products, on its own (benches/NOTES.md, twenty-seventh
// session): 73 matrix-vector phases in the shape of GPT-2 small's step at batch 1 (per layer
// QKV, a 64-row stand-in for the cache append, a 768 x 768 read standing in for attention's
// cache, the out-projection, MLP up and down; then the vocabulary), fp16 weights stored
// [N, K], each phase reading the one before's output (f32 partial sums). Run as
//   - one kernel a phase in a CUDA graph, with and without programmatic dependent launch, the
//     next kernel let scheduled before or after the wait, the next phase's weights asked of L2;
//   - one persistent kernel with a grid barrier (a counter, release/acquire) between phases:
//     the phase's first weights in registers before the barrier, or the next phase's too, or
//     every phase's weights streamed through a ring of shared-memory slots by bulk copies.
// SIDE=1: the chain with a side branch of the graph asking L2 for later phases' weights
// (forty-seventh session); BULK=1: each kernel asking L2 for a later phase's weights itself,
// in bulk (its block's share), after its wait or at its end (not yet run).
// Each phase's first items are loaded before it waits. Every variant prints its median and a
// digest of the last output, the same bits in every variant. TINY=1 makes every phase 64 x 768
// (98 KB): what a dependent phase costs with next to nothing to read. TWO=1 makes a layer two
// phases of the same bytes (its attention with both projections, its MLP's two products, the
// sums split over K): 25 dependent phases a step rather than 73. Compile-time sizes:
// -DTHREADS_=512 -DMINB=1 -DGRIDM=1 -DPRE_=2 (threads a block, blocks a multiprocessor the
// launch bounds ask, blocks a multiprocessor launched, items a warp loads before the wait).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <string>
#include <cmath>

#include "common.cuh"

#ifndef THREADS_
#define THREADS_ 512
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef GRIDM
#define GRIDM 1
#endif
#ifndef PRE_
#define PRE_ 2
#endif
constexpr int THREADS = THREADS_;
constexpr int WARPS = THREADS / 32;
constexpr int PRE = PRE_;                // items a warp loads before the wait




struct Pre { uint4 v[PRE][VEC]; };


__device__ __forceinline__ void load_pre(const Phase& p, int vblock, int nblocks, Pre& pre) {
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int chunks = p.k / CHUNK, items = items_of(p);
  int gw = vblock * WARPS + warp, tw = nblocks * WARPS;
#pragma unroll
  for (int i = 0; i < PRE; i++) {
    int it = gw + i * tw;
    if (it < items) {
      int n = it / chunks, c = it % chunks;
      const uint4* row = reinterpret_cast<const uint4*>(p.w + (size_t)n * p.k + c * CHUNK);
#pragma unroll
      for (int v = 0; v < VEC; v++) pre.v[i][v] = __ldg(row + v * 32 + lane);
    }
  }
}

// every item of the phase this block will read, asked of L2 (lines of 128 bytes)
__device__ __forceinline__ void prefetch_l2(const Phase& p, int vblock, int nblocks, int from) {
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int chunks = p.k / CHUNK, items = items_of(p);
  int gw = vblock * WARPS + warp, tw = nblocks * WARPS;
  for (int it = gw + from * tw; it < items; it += tw) {
    int n = it / chunks, c = it % chunks;
    const char* row = reinterpret_cast<const char*>(p.w + (size_t)n * p.k + c * CHUNK);
    if (lane < CHUNK * 2 / 128) asm volatile("prefetch.global.L2 [%0];" :: "l"(row + lane * 128));
  }
}

// `len` bytes at `p` (a multiple of 16) asked of L2 by the copy engine, not waited for.
__device__ __forceinline__ void prefetch_bulk(const char* p, unsigned len) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(len) : "memory");
}

// Phases [from, to)'s weights asked of L2 by bulk prefetches (pieces of 16 KB dealt over every
// thread of the grid: one multiprocessor's copy engine issues about a line a cycle): the side
// branch of `kernels, PDL, side prefetch`, off the chain's path.
__global__ void side_prefetch(const Phase* ps, int from, int to) {
  size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, all = (size_t)gridDim.x * blockDim.x;
  size_t base = 0;
  for (int ph = from; ph < to; ph++) {
    const char* w = reinterpret_cast<const char*>(ps[ph].w);
    size_t bytes = (size_t)ps[ph].n * ps[ph].k * 2, pieces = (bytes + 16383) >> 14;
    for (size_t i = (t + all - base % all) % all; i < pieces; i += all) {
      unsigned len = (unsigned)min((size_t)16384, bytes - (i << 14));
      prefetch_bulk(w + (i << 14), len);
    }
    base += pieces;
  }
}

__device__ __forceinline__ void grid_wait(unsigned* bar, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

__device__ __forceinline__ void grid_arrive(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(bar) : "memory");
}


__device__ __forceinline__ void finish(const Phase& p, int vblock, int nblocks, const Pre& pre) {
  extern __shared__ float xs[];
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int chunks = p.k / CHUNK, items = items_of(p);
  int gw = vblock * WARPS + warp, tw = nblocks * WARPS;
  for (int k = threadIdx.x; k < p.k; k += THREADS) {
    float s = 0.f;
    for (int c = 0; c < p.xchunks; c++) s += __ldcg(p.x + (size_t)c * p.k + k);
    xs[k] = s;
  }
  __syncthreads();
  auto item = [&](int it, const uint4 (&w)[VEC]) { dot_item(p, xs, it / chunks, it % chunks, w); };
#pragma unroll
  for (int i = 0; i < PRE; i++) {
    int it = gw + i * tw;
    if (it < items) item(it, pre.v[i]);
  }
  for (int it = gw + PRE * tw; it < items; it += tw) {
    int n = it / chunks, c = it % chunks;
    const uint4* row = reinterpret_cast<const uint4*>(p.w + (size_t)n * p.k + c * CHUNK);
    uint4 w[VEC];
#pragma unroll
    for (int v = 0; v < VEC; v++) w[v] = __ldg(row + v * 32 + lane);
    item(it, w);
  }
}

template <bool L2, bool EARLY = true>
__global__ void __launch_bounds__(THREADS, MINB) phase_kernel(Phase p, Phase next, int has_next) {
  if (EARLY) launch_dep();
  Pre pre;
  load_pre(p, blockIdx.x, gridDim.x, pre);
  if (L2 && has_next) prefetch_l2(next, blockIdx.x, gridDim.x, 0);
  wait_dep();
  if (!EARLY) launch_dep();
  finish(p, blockIdx.x, gridDim.x, pre);
}

// The block's share of phase `q`'s weights asked of L2 by bulk prefetches (pieces of 16 KB
// dealt over warp 0's lanes): `kernels, PDL, bulk +A` below.
__device__ __forceinline__ void prefetch_share(const Phase& q) {
  if (threadIdx.x >= 32) return;
  size_t bytes = (size_t)q.n * q.k * 2, share = (bytes / gridDim.x + 15) & ~(size_t)15;
  size_t from = share * blockIdx.x, to = min(bytes, from + share);
  const char* w = reinterpret_cast<const char*>(q.w);
  for (size_t off = from + (size_t)threadIdx.x * 16384; off < to; off += 32 * 16384) {
    unsigned len = (unsigned)min((size_t)16384, to - off);
    prefetch_bulk(w + off, len);
  }
}

// As `phase_kernel<false>`, and the block's share of a later phase's weights (`ahead`) asked of
// L2 by bulk prefetches: right after the wait (AT_END false, the phase's own first loads already
// out) or once the phase's products are done (AT_END true).
template <bool AT_END>
__global__ void __launch_bounds__(THREADS, MINB) phase_kernel_bulk(Phase p, Phase ahead, int has_ahead) {
  launch_dep();
  Pre pre;
  load_pre(p, blockIdx.x, gridDim.x, pre);
  wait_dep();
  if (!AT_END && has_ahead) prefetch_share(ahead);
  finish(p, blockIdx.x, gridDim.x, pre);
  if (AT_END && has_ahead) prefetch_share(ahead);
}

// DEPTH 1: a phase's first items loaded before its barrier; DEPTH 2: the next phase's too,
// before the current one's barrier. L2: the phase after those asked of L2.
template <int DEPTH, bool L2>
__global__ void __launch_bounds__(THREADS, 1) persistent_kernel(const Phase* ps, int count, unsigned* bar) {
  Pre a, b;
  int g = gridDim.x, vb = blockIdx.x;
  load_pre(ps[0], vb, g, a);
  for (int i = 0; i < count; i += 2) {
    if (DEPTH == 2 && i + 1 < count) load_pre(ps[i + 1], vb, g, b);
    if (L2 && i + DEPTH < count) prefetch_l2(ps[i + DEPTH], vb, g, 0);
    grid_wait(bar, i * g);
    finish(ps[i], vb, g, a);
    grid_arrive(bar);
    if (i + 1 >= count) break;
    if (DEPTH == 1) load_pre(ps[i + 1], vb, g, b);
    if (DEPTH == 2 && i + 2 < count) load_pre(ps[i + 2], vb, g, a);
    if (L2 && i + 1 + DEPTH < count) prefetch_l2(ps[i + 1 + DEPTH], vb, g, 0);
    grid_wait(bar, (i + 1) * g);
    finish(ps[i + 1], vb, g, b);
    grid_arrive(bar);
    if (DEPTH == 1 && i + 2 < count) load_pre(ps[i + 2], vb, g, a);
  }
}


// Weights through a ring of shared-memory slots filled by bulk copies: a slot is one block's
// 16 items of one phase (16 x 1536 bytes); the copies run ahead of the grid barriers.
constexpr int SLOT = WARPS * CHUNK * 2;  // bytes
constexpr int RING = 8;

__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

struct Cursor { int phase, i; };

__device__ __forceinline__ bool next_slot(const Phase* ps, int count, int vb, int g, Cursor& c) {
  // advance to the next (phase, i) that has items for this block
  while (c.phase < count) {
    int items = items_of(ps[c.phase]);
    if (c.i * g * WARPS + vb * WARPS < items) return true;
    c.phase++; c.i = 0;
  }
  return false;
}

__device__ __forceinline__ void issue(const Phase* ps, int vb, int g, Cursor c, char* slot, unsigned long long* mb) {
  const Phase& p = ps[c.phase];
  int items = items_of(p);
  int first = c.i * g * WARPS + vb * WARPS;
  int n = min(WARPS, items - first);
  unsigned bytes = n * CHUNK * 2;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(mb)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(saddr(slot)), "l"(p.w + (size_t)first * CHUNK), "r"(bytes), "r"(saddr(mb)) : "memory");
}

__global__ void __launch_bounds__(THREADS, 1) persistent_ring(const Phase* ps, int count, unsigned* bar) {
  extern __shared__ __align__(128) char smem_raw[];
  float* xs = reinterpret_cast<float*>(smem_raw);
  char* ring = smem_raw + XS_MAX * 4;
  unsigned long long* mb = reinterpret_cast<unsigned long long*>(ring + RING * SLOT);
  int g = gridDim.x, vb = blockIdx.x;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Cursor prod{0, 0};
  if (threadIdx.x == 0) {
    for (int r = 0; r < RING; r++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(mb + r)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int r = 0; r < RING; r++) {
      if (!next_slot(ps, count, vb, g, prod)) break;
      issue(ps, vb, g, prod, ring + r * SLOT, mb + r);
      prod.i++;
    }
  }
  int used = 0;  // slots consumed so far
  for (int ph = 0; ph < count; ph++) {
    const Phase& p = ps[ph];
    int chunks = p.k / CHUNK, items = items_of(p);
    grid_wait(bar, ph * g);
    for (int k = threadIdx.x; k < p.k; k += THREADS) {
      float s = 0.f;
      for (int c = 0; c < p.xchunks; c++) s += __ldcg(p.x + (size_t)c * p.k + k);
      xs[k] = s;
    }
    __syncthreads();
    for (int i = 0; i * g * WARPS + vb * WARPS < items; i++) {
      int r = used % RING;
      unsigned parity = (used / RING) & 1;
      unsigned ok = 0;
      do {
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(ok) : "r"(saddr(mb + r)), "r"(parity) : "memory");
      } while (!ok);
      int it = i * g * WARPS + vb * WARPS + warp;
      if (it < items) {
        const uint4* row = reinterpret_cast<const uint4*>(ring + r * SLOT + warp * CHUNK * 2);
        uint4 w[VEC];
#pragma unroll
        for (int v = 0; v < VEC; v++) w[v] = row[v * 32 + lane];
        dot_item(p, xs, it / chunks, it % chunks, w);
      }
      __syncthreads();
      used++;
      if (threadIdx.x == 0 && next_slot(ps, count, vb, g, prod)) {
        issue(ps, vb, g, prod, ring + r * SLOT, mb + r);
        prod.i++;
      }
    }
    grid_arrive(bar);
  }
}


int main() {
  int dev = 0, sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("%s, %d SMs\n", prop.name, sms);
  // GPT-2 small, batch 1: per layer QKV, append, attention (its cache's bytes), out, up, down.
  struct Shape { int n, k; };
  std::vector<Shape> shapes;
  for (int l = 0; l < 12; l++) {
    shapes.push_back({2304, 768});
    shapes.push_back({64, 768});
    shapes.push_back({768, 768});
    shapes.push_back({768, 768});
    shapes.push_back({3072, 768});
    shapes.push_back({768, 3072});
  }
  shapes.push_back({50257, 768});
  const bool two = getenv("TWO") != nullptr;
  if (two) {
    // A layer in two dependent phases of the same bytes: its attention with the QKV and
    // out-projections (5.9 MB), its MLP's two products (9.4 MB), each phase's 768 outputs
    // as sums split 5 and 8 ways, added by the phase after as it reads them.
    shapes.clear();
    for (int l = 0; l < 12; l++) {
      shapes.push_back({3840, 768});
      shapes.push_back({6144, 768});
    }
    shapes.push_back({50257, 768});
  }
  if (getenv("TINY")) for (auto& s : shapes) { s.n = 64; s.k = 768; }
  size_t wbytes = 0;
  for (auto s : shapes) wbytes += (size_t)s.n * s.k * 2;
  std::vector<__half*> ws;
  for (auto s : shapes) {
    __half* w;
    CK(cudaMalloc(&w, (size_t)s.n * s.k * 2));
    fill<<<256, 256>>>(w, (size_t)s.n * s.k, (unsigned)ws.size());
    ws.push_back(w);
  }
  // activations: a ring of buffers, each [4, 50257] floats
  std::vector<float*> acts(shapes.size() + 1);
  for (auto& a : acts) { CK(cudaMalloc(&a, 4 * 50257 * 4)); CK(cudaMemset(a, 0, 4 * 50257 * 4)); }
  fillf<<<1, 256>>>(acts[0], 4 * 50257);
  std::vector<Phase> ps;
  int xch = 1;  // partial sums the first phase reads: one
  for (size_t i = 0; i < shapes.size(); i++) {
    // A phase reads the first k of the one before's outputs, summing its partials.
    ps.push_back(Phase{ws[i], acts[i], acts[i + 1], shapes[i].n, shapes[i].k, xch});
    xch = two ? shapes[i].n / CHUNK : shapes[i].k / CHUNK;
  }
  Phase* dps;
  CK(cudaMalloc(&dps, ps.size() * sizeof(Phase)));
  CK(cudaMemcpy(dps, ps.data(), ps.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  unsigned* bar;
  CK(cudaMalloc(&bar, 4));
  size_t smem = XS_MAX * 4;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // the copy rate
  void *ca, *cb;
  size_t cbytes = 256 << 20;
  CK(cudaMalloc(&ca, cbytes)); CK(cudaMalloc(&cb, cbytes));
  auto timeit = [&](auto fn, int iters) { return median_ms(st, fn, iters); };
  auto summary = [&]() { return digest(st, acts.back()); };
  float cms = timeit([&] { CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, st)); }, 50);
  double rate = cbytes / (cms * 1e-3);
  printf("copy rate %.0f GB/s (bytes/time of a D2D copy); weights %.1f MB; floor %.4f ms\n", rate / 1e9,
         wbytes / 1e6, wbytes / rate * 1e3);
  int grid = sms * GRIDM;
  printf("threads %d, min blocks %d, grid %d, items loaded before the wait %d\n", THREADS, MINB, grid, PRE);
  // Records the launches `record` makes into a CUDA graph, times its replays, prints the median.
  auto time_graph = [&](auto record, const char* name) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    record();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    float ms = timeit([&] { CK(cudaGraphLaunch(ge, st)); }, 200);
    printf("%-40s %.4f ms; %s\n", name, ms, summary().c_str());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  };
  // Phase i's kernel, with (programmatic launch) or without, the phase `ahead` later as its
  // second phase (the one it asks L2 for, where it asks).
  auto launch_phase = [&](auto kern, int pdl, int i, int ahead) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid; cfg.blockDim = THREADS; cfg.dynamicSmemBytes = smem; cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl;
    cfg.attrs = at; cfg.numAttrs = 1;
    int has = i + ahead < (int)ps.size();
    CK(cudaLaunchKernelEx(&cfg, kern, ps[i], ps[has ? i + ahead : i], has));
  };
  // The chain as one kernel a phase; each kernel's second phase the one `ahead` after it.
  auto kernels = [&](auto kern, int pdl, const char* name, int ahead) {
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    time_graph([&] {
      for (int i = 0; i < (int)ps.size(); i++) launch_phase(kern, pdl, i, ahead);
    }, name);
  };
  // The chain's kernels (programmatic launch) with a side branch: after phase i's kernel ends,
  // a one-warp kernel asks L2 for the weights of phases [i + ahead, i + ahead + stride) (every
  // stride phases); the branch joins the chain at its end.
  cudaStream_t side;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> evs(ps.size() + 2);
  for (auto& ev : evs) CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  auto side_kernels = [&](int ahead, int stride) {
    char name[64];
    snprintf(name, 64, "kernels, PDL, side prefetch +%d/%d", ahead, stride);
    auto kern = phase_kernel<false>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int n = (int)ps.size();
    time_graph([&] {
      // the first phases' weights before the chain starts
      CK(cudaEventRecord(evs[n], st));
      CK(cudaStreamWaitEvent(side, evs[n], 0));
      side_prefetch<<<sms, 32, 0, side>>>(dps, 0, std::min(ahead, n));
      for (int i = 0; i < n; i++) {
        launch_phase(kern, 1, i, 1);
        int from = i + ahead;
        if (i % stride == 0 && from < n) {
          CK(cudaEventRecord(evs[i], st));
          CK(cudaStreamWaitEvent(side, evs[i], 0));
          side_prefetch<<<sms, 32, 0, side>>>(dps, from, std::min(from + stride, n));
        }
      }
      CK(cudaEventRecord(evs[n + 1], side));
      CK(cudaStreamWaitEvent(st, evs[n + 1], 0));
    }, name);
  };
  // One launch of a persistent kernel, its barrier's counter zeroed first.
  auto persistent = [&](auto kern, const char* name, size_t bytes) {
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    time_graph([&] {
      CK(cudaMemsetAsync(bar, 0, 4, st));
      kern<<<grid, THREADS, bytes, st>>>(dps, (int)ps.size(), bar);
    }, name);
  };
  kernels(phase_kernel<false>, 0, "kernels, no PDL", 1);
  kernels(phase_kernel<false>, 1, "kernels, PDL", 1);
  kernels(phase_kernel<true>, 1, "kernels, PDL, next asked of L2", 1);
  kernels(phase_kernel<false, false>, 1, "kernels, PDL, trigger after the wait", 1);
  kernels(phase_kernel<true, false>, 1, "kernels, PDL, L2, trigger after wait", 1);
  if (getenv("BULK")) {
    // Each kernel asking L2 for phase i + a's weights itself, in bulk.
    for (int a : {1, 2, 3}) {
      char name[64];
      snprintf(name, 64, "kernels, PDL, bulk +%d after the wait", a);
      kernels(phase_kernel_bulk<false>, 1, name, a);
      snprintf(name, 64, "kernels, PDL, bulk +%d at the end", a);
      kernels(phase_kernel_bulk<true>, 1, name, a);
    }
    return 0;
  }
  if (getenv("SIDE")) {
    for (int a : {1, 2, 3, 6}) side_kernels(a, 1);
    side_kernels(6, 3);
    side_kernels(6, 6);
    side_kernels(12, 6);
    return 0;
  }
  persistent(persistent_kernel<1, false>, "persistent, depth 1", smem);
  persistent(persistent_kernel<2, false>, "persistent, depth 2", smem);
  persistent(persistent_kernel<1, true>, "persistent, depth 1, L2 next", smem);
  persistent(persistent_kernel<2, true>, "persistent, depth 2, L2 after", smem);
  persistent(persistent_ring, "persistent, ring of bulk copies", XS_MAX * 4 + RING * SLOT + RING * 8);
  CK(cudaStreamSynchronize(st));
  return 0;
}
