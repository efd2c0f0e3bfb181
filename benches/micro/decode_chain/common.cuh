// What the decoding chain's microbenchmarks share (`chain.cu`, `staged.cu`): the phase of a
// matrix-vector product (fp16 weights stored [N, K] in items of 768 elements, the input and the
// output as f32 partial sums), programmatic dependent launch's two instructions, one item's dot
// product, the weights' and the input's fills, the timing (a median of CUDA events) and the
// digest of the last output.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int CHUNK = 768;           // elements of K an item covers
constexpr int VEC = CHUNK / 8 / 32;  // uint4 a lane an item: 3
constexpr int XS_MAX = 3072;         // the widest K

struct Phase {
  const __half* w;  // [N, K] rows
  const float* x;   // [xchunks, K] partials of the input (summed on read)
  float* y;         // [K / CHUNK, N] partials
  int n, k, xchunks;
};

__device__ __forceinline__ void wait_dep() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void launch_dep() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ int items_of(const Phase& p) { return p.n * (p.k / CHUNK); }

// One item's dot product (a lane's VEC packs of the row against xs), summed over the warp and
// stored by lane 0 as partial c of output n.
__device__ __forceinline__ void dot_item(const Phase& p, const float* xs, int n, int c, const uint4 (&w)[VEC]) {
  int lane = threadIdx.x % 32;
  float s = 0.f;
#pragma unroll
  for (int v = 0; v < VEC; v++) {
    const __half2* h = reinterpret_cast<const __half2*>(&w[v]);
    const float* xv = xs + c * CHUNK + (v * 32 + lane) * 8;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float2 f = __half22float2(h[j]);
      s += f.x * xv[2 * j] + f.y * xv[2 * j + 1];
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if (lane == 0) p.y[(size_t)c * p.n + n] = s;
}

__global__ void fill(__half* w, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    w[i] = __float2half(((h & 0xffff) / 65535.f - 0.5f) * 0.12f);
  }
}
__global__ void fillf(float* x, int n) { for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = 1.f + 0.001f * i; }

// The median ms of `iters` timed calls of `fn` on stream `st` (CUDA events), after 20 untimed.
template <class F>
float median_ms(cudaStream_t st, F fn, int iters) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 20; i++) fn();
  CK(cudaStreamSynchronize(st));
  std::vector<float> t;
  for (int i = 0; i < iters; i++) {
    CK(cudaEventRecord(e0, st)); fn(); CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
  }
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A digest of the chain's last output (50,257 floats): its sum, its absolute sum and element 7,
// the same bits in every variant.
inline std::string digest(cudaStream_t st, const float* out) {
  CK(cudaStreamSynchronize(st));
  std::vector<float> h(50257);
  CK(cudaMemcpy(h.data(), out, 50257 * 4, cudaMemcpyDeviceToHost));
  double a = 0, b = 0;
  for (float v : h) { a += v; b += fabs(v); }
  char buf[128];
  snprintf(buf, 128, "out sum %.6e abs %.6e, [7] %.6e", a, b, h[7]);
  return std::string(buf);
}
