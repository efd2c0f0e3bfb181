// A decoding step's top-k / top-p draw on its own (benches/NOTES.md, thirty-second session):
// `kernels/sample_rows.cu` as fusec ships it (a cluster of 8 blocks of 512 threads a row,
// SAMPLE_CLUSTER=8), launched as the runtime launches it on rows of 50,257 random logits
// (normal, scale 3: a flat-ish distribution, as a random-weight model gives), each row's part
// and its weights in shared memory. Prints the median GPU time of each draw (CUDA events, 200
// launches after 20) and, built with -DSAMPLE_TRACE, where the first block's time goes (the
// marks in the kernel, µs from its start). Arguments: rows (default 1).
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define SAMPLE_CLUSTER 8
#ifndef __CUDA_ARCH__
// nvcc's host pass (no __CUDA_ARCH__, so fusec.cuh leaves the cluster helpers out): declared
// for the kernel's source to parse; the device pass compiles the real ones.
#include "fusec.cuh"
#undef FUSEC_CLUSTERS
#define FUSEC_CLUSTERS 1
namespace fusec {
__device__ unsigned cluster_rank();
__device__ void cluster_sync();
template <typename T>
__device__ const T* cluster_map(const T* p, unsigned rank);
}  // namespace fusec
#endif
#include "sample_rows.cu"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

int main(int argc, char** argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 1;
    const unsigned long long width = 50257;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(rows * width);
    for (auto& v : logits) v = normal(rng);
    std::vector<double> draws(rows);
    for (int r = 0; r < rows; ++r) draws[r] = (r * 0.37 + 0.11) - (int)(r * 0.37 + 0.11);
    float* x;
    long long* out;
    double *d_draws, *weights;
    CK(cudaMalloc(&x, logits.size() * 4));
    CK(cudaMalloc(&out, rows * 8));
    CK(cudaMalloc(&d_draws, rows * 8));
    CK(cudaMalloc(&weights, rows * width * 8));
    CK(cudaMemcpy(x, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_draws, draws.data(), rows * 8, cudaMemcpyHostToDevice));
    const unsigned long long part = (width + SAMPLE_CLUSTER - 1) / SAMPLE_CLUSTER;
    struct Case {
        const char* name;
        int mode;
        unsigned long long k;
        double p;
        int shared;
    } cases[] = {{"top-k 50", 1, 50, 1.0, 2},   {"top-k 1", 1, 1, 1.0, 2},   {"top-p 0.9", 2, 0, 0.9, 2},
                 {"top-p 0.5", 2, 0, 0.5, 2},   {"top-p 0.9, weights in global memory", 2, 0, 0.9, 1},
                 {"top-k 50, weights in global memory", 1, 50, 1.0, 1}};
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (const Case& c : cases) {
        const size_t dynamic = c.shared == 2 ? ((part + 1) & ~1ull) * 4 + part * 8 : part * 4;
        CK(cudaFuncSetAttribute(fusec_sample_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic));
        std::vector<float> times;
        for (int i = 0; i < 220; ++i) {
            CK(cudaEventRecord(a));
            fusec_sample_rows<<<rows * SAMPLE_CLUSTER, THREADS, dynamic>>>(x, out, nullptr, width, width, d_draws,
                                                                           weights, c.shared, c.mode, c.k, c.p, 0.8);
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            if (i >= 20) times.push_back(ms * 1000.0f);
        }
        CK(cudaGetLastError());
        std::sort(times.begin(), times.end());
        long long id;
        CK(cudaMemcpy(&id, out, 8, cudaMemcpyDeviceToHost));
        printf("%-40s rows %d: median %.1f us (p10 %.1f, p90 %.1f), row 0 drew %lld\n", c.name, rows,
               times[times.size() / 2], times[times.size() / 10], times[times.size() * 9 / 10], id);
#ifdef SAMPLE_TRACE
        unsigned long long trace[64];
        CK(cudaMemcpyFromSymbol(trace, sample_trace, sizeof trace));
        printf("   marks (us from mark 0):");
        for (int m = 1; m < 64; ++m)
            if (trace[m] >= trace[0] && trace[m] - trace[0] < 10000000ull)
                printf(" %d:%.1f", m, (trace[m] - trace[0]) / 1000.0);
        printf("\n");
        unsigned long long zero[64] = {};
        CK(cudaMemcpyToSymbol(sample_trace, zero, sizeof zero));
#endif
    }
    return 0;
}
