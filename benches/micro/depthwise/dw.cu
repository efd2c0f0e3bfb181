#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include "dwk.cuh"
static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); exit(1); }
}

template <typename F>
static float time_it(F launch) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 20; ++i) launch();
    std::vector<float> ts;
    for (int r = 0; r < 30; ++r) {
        cudaEventRecord(a);
        for (int i = 0; i < 20; ++i) launch();
        cudaEventRecord(b); cudaEventSynchronize(b);
        float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000.f / 20);
    }
    check(cudaGetLastError(), "launch");
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

template <int K>
static void shape(int N, int H, int W, int C) {
    size_t nx = (size_t)N * H * W * C;
    std::vector<__half> hx(nx), hw(K * K * C), hb(C);
    std::vector<float> fw(K * K * C);
    srand(7);
    for (auto& v : hx) v = __float2half((rand() / (float)RAND_MAX) * 2 - 1);
    for (size_t i = 0; i < hw.size(); ++i) { hw[i] = __float2half(((rand() / (float)RAND_MAX) * 2 - 1) * 0.2f); fw[i] = __half2float(hw[i]); }
    for (auto& v : hb) v = __float2half((rand() / (float)RAND_MAX) * 0.2f);
    __half *x, *w, *b, *y; float* wf;
    check(cudaMalloc(&x, nx * 2), "m"); cudaMalloc(&w, hw.size() * 2); cudaMalloc(&b, C * 2); cudaMalloc(&y, nx * 2); cudaMalloc(&wf, fw.size() * 4);
    cudaMemcpy(x, hx.data(), nx * 2, cudaMemcpyHostToDevice); cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), C * 2, cudaMemcpyHostToDevice); cudaMemcpy(wf, fw.data(), fw.size() * 4, cudaMemcpyHostToDevice);
    // float64 reference on a sample of outputs
    auto ref = [&](int n, int oh, int ow, int c) {
        double s = __half2float(hb[c]);
        for (int kh = 0; kh < K; ++kh) for (int kw = 0; kw < K; ++kw) {
            int ih = oh + kh - K / 2, iw = ow + kw - K / 2;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            s += (double)__half2float(hx[(((size_t)n * H + ih) * W + iw) * C + c]) * fw[(kh * K + kw) * C + c];
        }
        return s;
    };
    std::vector<__half> hy(nx);
    auto err = [&]() {
        cudaMemcpy(hy.data(), y, nx * 2, cudaMemcpyDeviceToHost);
        double num = 0, den = 0;
        for (size_t i = 0; i < nx; i += 97) {
            int c = i % C; size_t r = i / C; int ow = r % W; r /= W; int oh = r % H; int n = r / H;
            double e = ref(n, oh, ow, c), g = __half2float(hy[i]);
            num += (g - e) * (g - e); den += e * e;
        }
        cudaMemset(y, 0, nx * 2);
        return sqrt(num / den);
    };
    double bytes = 2.0 * nx * 2;
    printf("shape N=%d H=%d W=%d C=%d K=%d  (floor at 3 TB/s: %.2f us)\n", N, H, W, C, K, bytes / 3e6);
    auto report = [&](const char* name, float us) { double e = err(); printf("  %-28s %8.2f us  %6.0f GB/s  rel-L2 %.2e\n", name, us, bytes / us / 1e3, e); };
    {
        long long th = (long long)N * H * ((W + 3) / 4) * (C / 8);
        auto l = [&] { k0<K><<<(th + 127) / 128, 128>>>(x, w, b, y, N, H, W, C); };
        report("k0 generated (128)", time_it(l));
    }
    {
        long long th = (long long)N * H * ((W + 3) / 4) * (C / 8);
        auto l = [&] { k1<K, 4><<<(th + 127) / 128, 128>>>(x, wf, b, y, N, H, W, C); };
        report("k1 f32 weights c4", time_it(l));
        long long th2 = (long long)N * H * ((W + 1) / 2) * (C / 8);
        auto l2 = [&] { k1<K, 2><<<(th2 + 127) / 128, 128>>>(x, wf, b, y, N, H, W, C); };
        report("k1 f32 weights c2", time_it(l2));
    }
    {
        long long th = (long long)N * H * ((W + 3) / 4) * (C / 8);
        auto l = [&] { k2<K, 4><<<(th + 127) / 128, 128>>>(x, w, b, y, N, H, W, C); };
        report("k2 hfma2 rows c4", time_it(l));
        long long th8 = (long long)N * H * ((W + 7) / 8) * (C / 8);
        auto l8 = [&] { k2<K, 8><<<(th8 + 127) / 128, 128>>>(x, w, b, y, N, H, W, C); };
        report("k2 hfma2 rows c8", time_it(l8));
    }
    if (C % 32 == 0) {
        {
            constexpr int CT = 32, TR = 8, TW = 8, COLS = 4;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k3<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, wf, b, y, N, H, W, C); };
            report("k3 smem 32ch 8x8 c4", time_it(l));
        }
        {
            constexpr int CT = 32, TR = 4, TW = 8, COLS = 8;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k3<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, wf, b, y, N, H, W, C); };
            report("k3 smem 32ch 4x8 c8", time_it(l));
        }
        {
            constexpr int CT = 32, TR = 8, TW = 16, COLS = 8;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k3<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, wf, b, y, N, H, W, C); };
            report("k3 smem 32ch 8x16 c8", time_it(l));
        }
        {
            constexpr int CT = 32, TR = 7, TW = 7, COLS = 7;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k3<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, wf, b, y, N, H, W, C); };
            report("k3 smem 32ch 7x7 c7", time_it(l));
        }
    }
    if (C % 32 == 0) {
        {
            constexpr int CT = 32, TR = 8, TW = 16, COLS = 8;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k4<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, w, b, y, N, H, W, C); };
            report("k4 smem-h2 32ch 8x16 c8", time_it(l));
        }
        {
            constexpr int CT = 32, TR = 4, TW = 8, COLS = 8;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k4<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, w, b, y, N, H, W, C); };
            report("k4 smem-h2 32ch 4x8 c8", time_it(l));
        }
        {
            constexpr int CT = 32, TR = 7, TW = 7, COLS = 7;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k4<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, w, b, y, N, H, W, C); };
            report("k4 smem-h2 32ch 7x7 c7", time_it(l));
        }
        {
            constexpr int CT = 16, TR = 8, TW = 8, COLS = 4;
            int blocks = N * ((H + TR - 1) / TR) * ((W + TW - 1) / TW) * (C / CT);
            auto l = [&] { k4<K, CT, TR, TW, COLS><<<blocks, (CT / 2) * TR * (TW / COLS)>>>(x, w, b, y, N, H, W, C); };
            report("k4 smem-h2 16ch 8x8 c4", time_it(l));
        }
    }
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y); cudaFree(wf);
}

int main() {
    // ConvNeXt-T stages at batch 8 and 1
    shape<7>(8, 56, 56, 96);
    shape<7>(8, 28, 28, 192);
    shape<7>(8, 14, 14, 384);
    shape<7>(8, 7, 7, 768);
    shape<7>(1, 56, 56, 96);
    shape<7>(32, 56, 56, 96);
    // EfficientNet / MobileNet style 3x3
    shape<3>(8, 112, 112, 32);
    shape<3>(8, 56, 56, 144);
    shape<3>(8, 14, 14, 480);
    return 0;
}
