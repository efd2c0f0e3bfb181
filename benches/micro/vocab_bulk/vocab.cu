// A vocabulary's projection at a decoding step's rows, on its own (benches/NOTES.md, fiftieth
// session): C[M, N] (f32) = A[M, K] · Wᵀ, W stored [N, K] (GPT-2 small's tied embedding:
// N = 50,257, K = 768, 77 MB of fp16), M = 32 (or ROWS=1, 8). fusec's tensor-core kernel for a
// few rows reads W straight into registers (six chunks of K a warp in flight) and took 23.8 µs
// at 32 rows on the H200 (3.2 TB/s), its CUDA-core kernel 20.4 at one row: here W streams
// through a ring of shared-memory stages instead, each stage a tile of TILE rows of W copied by
// the bulk copy engine (one copy a row, into rows padded against bank conflicts) and completing
// on an mbarrier, a persistent grid of one block a multiprocessor, the products on tensor cores
// (mma.m16n8k16, fragments read from shared memory) while the next stages arrive. Variants:
// TILE 16 or 32 rows, 2 to 6 stages. Beside them: a read of the 77 MB alone (the floor this
// GPU's reads allow) and a plain reference (each output a warp's dot product), against which
// every variant's output is checked. Prints each one's median (CUDA events around 20 launches
// back to back, a launch's share, 200 times after 20 untimed) and its rate.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int N = 50257, K = 768;
constexpr int ROW_BYTES = K * 2;          // a row of W or A: 1,536 bytes
constexpr int PAD = ROW_BYTES + 16;       // a row in shared memory: 388 words, 4 banks apart
constexpr int THREADS = 128, WARPS = THREADS / 32;

__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void wait_parity(unsigned long long* mb, unsigned parity) {
  unsigned ok = 0;
  do {
    asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                 : "=r"(ok) : "r"(saddr(mb)), "r"(parity) : "memory");
  } while (!ok);
}

// Tile `t`'s rows of W into `stage` by warp 0: lane 0 expects the bytes, then each lane copies
// rows (one bulk copy a row, into its padded place).
template <int TILE>
__device__ __forceinline__ void issue(const __half* w, int t, char* stage, unsigned long long* mb) {
  const int lane = threadIdx.x % 32;
  const int first = t * TILE, rows = min(TILE, N - first);
  if (lane == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(mb)), "r"(rows * ROW_BYTES) : "memory");
  __syncwarp();
  for (int r = lane; r < rows; r += 32)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(saddr(stage + r * PAD)), "l"(w + (size_t)(first + r) * K), "r"(ROW_BYTES), "r"(saddr(mb)) : "memory");
}

// The persistent kernel: A (M rows, padded to MP, zeros past M) staged once; tiles of W
// block b, b + grid, … through STAGES stages. Each warp takes 16-row slices of the tile × 8-row
// groups of A (TILE/16 × MP/8 products, dealt over the warps), each over all K in KS
// independent sums (K split in KS runs, so that the mma chains are short), then stores.
template <int M, int TILE, int STAGES>
__global__ void __launch_bounds__(THREADS, 1) bulk(const __half* a, const __half* w, float* c) {
  constexpr int MP = (M + 7) / 8 * 8, SLICES = TILE / 16, GROUPS = MP / 8, JOBS = SLICES * GROUPS;
  constexpr int PER = (JOBS + WARPS - 1) / WARPS, KS = 4, STEPS = K / 16 / KS;
  extern __shared__ __align__(128) char smem[];
  char* as = smem;
  char* ring = smem + MP * PAD;
  unsigned long long* mb = reinterpret_cast<unsigned long long*>(ring + STAGES * TILE * PAD);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tiles = (N + TILE - 1) / TILE;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(mb + s)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0)
    for (int s = 0; s < STAGES; s++) {
      const int t = blockIdx.x + s * gridDim.x;
      if (t < tiles) issue<TILE>(w, t, ring + s * TILE * PAD, mb + s);
    }
  // A into shared memory, rows padded, zeros past M.
  for (int i = threadIdx.x; i < MP * (ROW_BYTES / 16); i += THREADS) {
    const int r = i / (ROW_BYTES / 16), p = i % (ROW_BYTES / 16);
    const uint4 v = r < M ? reinterpret_cast<const uint4*>(a + (size_t)r * K)[p] : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(as + r * PAD + p * 16) = v;
  }
  __syncthreads();
  int used = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, used++) {
    const int s = used % STAGES;
    wait_parity(mb + s, (used / STAGES) & 1);
    const char* ws = ring + s * TILE * PAD;
#pragma unroll
    for (int j = 0; j < PER; j++) {
      const int job = warp + j * WARPS;
      if (job >= JOBS) break;
      const int slice = job % SLICES, group = job / SLICES;
      float acc[KS][4] = {};
      const char* wr0 = ws + (slice * 16 + g) * PAD;
      const char* wr1 = wr0 + 8 * PAD;
      const char* ar = as + (group * 8 + g) * PAD;
#pragma unroll
      for (int step = 0; step < STEPS; step++) {
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
          const int k0 = (ks * STEPS + step) * 16 * 2 + q * 4;  // bytes
          unsigned fa[4];
          fa[0] = *reinterpret_cast<const unsigned*>(wr0 + k0);
          fa[1] = *reinterpret_cast<const unsigned*>(wr1 + k0);
          fa[2] = *reinterpret_cast<const unsigned*>(wr0 + k0 + 16);
          fa[3] = *reinterpret_cast<const unsigned*>(wr1 + k0 + 16);
          const unsigned b0 = *reinterpret_cast<const unsigned*>(ar + k0);
          const unsigned b1 = *reinterpret_cast<const unsigned*>(ar + k0 + 16);
          mma(acc[ks], fa, b0, b1);
        }
      }
      // acc[.][0..1]: W row slice·16 + g, A rows group·8 + 2q, +1; [2..3]: W row + 8.
      const int n0 = t * TILE + slice * 16 + g;
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float v = acc[0][e] + acc[1][e] + acc[2][e] + acc[3][e];
        const int n = n0 + (e / 2) * 8, m = group * 8 + 2 * q + e % 2;
        if (n < N && m < M) c[(size_t)m * N + n] = v;
      }
    }
    __syncthreads();
    const int next = t + STAGES * gridDim.x;
    if (warp == 0 && next < tiles) issue<TILE>(w, next, ring + s * TILE * PAD, mb + s);
  }
}

// Each output a warp's dot product (f32), the reference.
template <int M>
__global__ void reference(const __half* a, const __half* w, float* c) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= N * M) return;
  const int n = warp % N, m = warp / N;
  float s = 0.f;
  for (int k = lane; k < K; k += 32) s += __half2float(w[(size_t)n * K + k]) * __half2float(a[(size_t)m * K + k]);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) c[(size_t)m * N + n] = s;
}

// W read alone: 16-byte loads, their XOR kept so that the reads stay.
__global__ void read_all(const uint4* w, size_t packs, unsigned* sink) {
  unsigned x = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = w[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x12345678u) *sink = x;
}

__global__ void fill(__half* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = __float2half(((h & 0xffff) / 65535.f - 0.5f) * 0.2f);
  }
}

template <class F>
float median_ms(F fn) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 20; i++) fn();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < 200; i++) {
    CK(cudaEventRecord(e0));
    for (int r = 0; r < 20; r++) fn();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms / 20);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

#ifndef ROWS
#define ROWS 32
#endif
constexpr int M = ROWS;

int sms;
__half *a, *w;
float *c, *ref;
std::vector<float> want;

template <int TILE, int STAGES>
void run_bulk() {
  constexpr int MP = (M + 7) / 8 * 8;
  const size_t smem = (size_t)MP * PAD + (size_t)STAGES * TILE * PAD + STAGES * 8;
  if (smem > 227 * 1024) { printf("tile %d, %d stages: %zu bytes of shared memory, over the limit\n", TILE, STAGES, smem); return; }
  auto k = bulk<M, TILE, STAGES>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  CK(cudaMemset(c, 0, sizeof(float) * M * N));
  const float ms = median_ms([&] { k<<<sms, THREADS, smem>>>(a, w, c); });
  CK(cudaGetLastError());
  std::vector<float> got((size_t)M * N);
  CK(cudaMemcpy(got.data(), c, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) { num += (got[i] - want[i]) * (got[i] - want[i]); den += want[i] * want[i]; }
  printf("bulk, tile %2d rows, %d stages (%3zu KB): %7.2f us, %.2f TB/s of W, rel-L2 %.1e against the reference\n",
         TILE, STAGES, smem / 1024, ms * 1e3, (double)N * K * 2 / (ms * 1e-3) / 1e12, std::sqrt(num / den));
}

int main() {
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d multiprocessors; C[%d, %d] = A[%d, %d] · W[%d, %d]ᵀ, fp16 in, f32 out\n", prop.name, sms, M, N, M, K, N, K);
  CK(cudaMalloc(&a, sizeof(__half) * M * K));
  CK(cudaMalloc(&w, sizeof(__half) * (size_t)N * K));
  CK(cudaMalloc(&c, sizeof(float) * M * N));
  CK(cudaMalloc(&ref, sizeof(float) * M * N));
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  fill<<<1024, 256>>>(a, (size_t)M * K, 1);
  fill<<<1024, 256>>>(w, (size_t)N * K, 2);
  CK(cudaDeviceSynchronize());
  const float ms_ref = median_ms([&] { reference<M><<<(N * M * 32 + 255) / 256, 256>>>(a, w, ref); });
  want.resize((size_t)M * N);
  CK(cudaMemcpy(want.data(), ref, sizeof(float) * want.size(), cudaMemcpyDeviceToHost));
  const size_t packs = (size_t)N * K / 8;
  const float ms_read = median_ms([&] { read_all<<<sms * 8, 512>>>(reinterpret_cast<const uint4*>(w), packs, sink); });
  printf("W read alone: %7.2f us, %.2f TB/s\n", ms_read * 1e3, (double)N * K * 2 / (ms_read * 1e-3) / 1e12);
  printf("reference (a warp an output): %7.2f us\n", ms_ref * 1e3);
  run_bulk<16, 2>();
  run_bulk<16, 4>();
  run_bulk<16, 6>();
  run_bulk<32, 2>();
  run_bulk<32, 3>();
  return 0;
}
