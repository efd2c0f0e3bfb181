// Depthwise 7x7 (and 3x3) NHWC fp16 variants, timed with CUDA events.
#include <cuda_fp16.h>

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };
using P8 = Pack<__half, 8>;

template <typename P> __device__ __forceinline__ P load_or_zero(const P* p, bool inside) { P v{}; if (inside) v = *p; return v; }

// K0: the generated form: 4 columns x 8 channels per thread, half weights tap-major [kh][kw][C].
template <int K>
__global__ void __launch_bounds__(256) k0(const __half* __restrict__ x, const __half* __restrict__ w, const __half* __restrict__ b,
                                          __half* __restrict__ y, int N, int H, int W, int C) {
    const int COLS = 4;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int cp = C / 8, wt = (W + COLS - 1) / COLS;
    long long total = (long long)N * H * wt * cp;
    if (t >= total) return;
    int c = (t % cp) * 8; long long r = t / cp;
    int q0 = (r % wt) * COLS; r /= wt;
    int oh = r % H; int n = r / H;
    const int P = K / 2, L = COLS + K - 1;
    float acc[COLS][8] = {};
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
        int ih = oh + kh - P;
        if (ih < 0 || ih >= H) continue;
        P8 xq[L];
#pragma unroll
        for (int col = 0; col < L; ++col) {
            int iw = q0 + col - P;
            xq[col] = load_or_zero(reinterpret_cast<const P8*>(x + (((long long)n * H + ih) * W + iw) * C + c), iw >= 0 && iw < W);
        }
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
            const P8 wq = *reinterpret_cast<const P8*>(w + (kh * K + kw) * C + c);
#pragma unroll
            for (int tt = 0; tt < COLS; ++tt)
#pragma unroll
                for (int u = 0; u < 8; ++u) acc[tt][u] += __half2float(xq[tt + kw].v[u]) * __half2float(wq.v[u]);
        }
    }
    const P8 bq = *reinterpret_cast<const P8*>(b + c);
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) {
        if (q0 + tt >= W) break;
        P8 o;
#pragma unroll
        for (int u = 0; u < 8; ++u) o.v[u] = __float2half(acc[tt][u] + __half2float(bq.v[u]));
        *reinterpret_cast<P8*>(y + (((long long)n * H + oh) * W + q0 + tt) * C + c) = o;
    }
}

// K1: K0 with f32 weights (two float4 per tap), x converted once per load.
template <int K, int COLS>
__global__ void __launch_bounds__(256) k1(const __half* __restrict__ x, const float* __restrict__ w, const __half* __restrict__ b,
                                          __half* __restrict__ y, int N, int H, int W, int C) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int cp = C / 8, wt = (W + COLS - 1) / COLS;
    long long total = (long long)N * H * wt * cp;
    if (t >= total) return;
    int c = (t % cp) * 8; long long r = t / cp;
    int q0 = (r % wt) * COLS; r /= wt;
    int oh = r % H; int n = r / H;
    const int P = K / 2, L = COLS + K - 1;
    float acc[COLS][8] = {};
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
        int ih = oh + kh - P;
        if (ih < 0 || ih >= H) continue;
        float xf[L][8];
#pragma unroll
        for (int col = 0; col < L; ++col) {
            int iw = q0 + col - P;
            P8 q = load_or_zero(reinterpret_cast<const P8*>(x + (((long long)n * H + ih) * W + iw) * C + c), iw >= 0 && iw < W);
#pragma unroll
            for (int u = 0; u < 8; ++u) xf[col][u] = __half2float(q.v[u]);
        }
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
            const float4 w0 = *reinterpret_cast<const float4*>(w + (kh * K + kw) * C + c);
            const float4 w1 = *reinterpret_cast<const float4*>(w + (kh * K + kw) * C + c + 4);
            const float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
            for (int tt = 0; tt < COLS; ++tt)
#pragma unroll
                for (int u = 0; u < 8; ++u) acc[tt][u] = fmaf(xf[tt + kw][u], wf[u], acc[tt][u]);
        }
    }
    const P8 bq = *reinterpret_cast<const P8*>(b + c);
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) {
        if (q0 + tt >= W) break;
        P8 o;
#pragma unroll
        for (int u = 0; u < 8; ++u) o.v[u] = __float2half(acc[tt][u] + __half2float(bq.v[u]));
        *reinterpret_cast<P8*>(y + (((long long)n * H + oh) * W + q0 + tt) * C + c) = o;
    }
}

// K2: each kernel row's taps in half2 (HFMA2), added to f32 accumulators after the row.
template <int K, int COLS>
__global__ void __launch_bounds__(256) k2(const __half* __restrict__ x, const __half* __restrict__ w, const __half* __restrict__ b,
                                          __half* __restrict__ y, int N, int H, int W, int C) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int cp = C / 8, wt = (W + COLS - 1) / COLS;
    long long total = (long long)N * H * wt * cp;
    if (t >= total) return;
    int c = (t % cp) * 8; long long r = t / cp;
    int q0 = (r % wt) * COLS; r /= wt;
    int oh = r % H; int n = r / H;
    const int P = K / 2, L = COLS + K - 1;
    float acc[COLS][8] = {};
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
        int ih = oh + kh - P;
        if (ih < 0 || ih >= H) continue;
        Pack<__half2, 4> xq[L];
#pragma unroll
        for (int col = 0; col < L; ++col) {
            int iw = q0 + col - P;
            xq[col] = load_or_zero(reinterpret_cast<const Pack<__half2, 4>*>(x + (((long long)n * H + ih) * W + iw) * C + c), iw >= 0 && iw < W);
        }
        __half2 h[COLS][4];
#pragma unroll
        for (int tt = 0; tt < COLS; ++tt)
#pragma unroll
            for (int u = 0; u < 4; ++u) h[tt][u] = __float2half2_rn(0.f);
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
            const Pack<__half2, 4> wq = *reinterpret_cast<const Pack<__half2, 4>*>(w + (kh * K + kw) * C + c);
#pragma unroll
            for (int tt = 0; tt < COLS; ++tt)
#pragma unroll
                for (int u = 0; u < 4; ++u) h[tt][u] = __hfma2(xq[tt + kw].v[u], wq.v[u], h[tt][u]);
        }
#pragma unroll
        for (int tt = 0; tt < COLS; ++tt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float2 f = __half22float2(h[tt][u]);
                acc[tt][2 * u] += f.x;
                acc[tt][2 * u + 1] += f.y;
            }
    }
    const P8 bq = *reinterpret_cast<const P8*>(b + c);
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) {
        if (q0 + tt >= W) break;
        P8 o;
#pragma unroll
        for (int u = 0; u < 8; ++u) o.v[u] = __float2half(acc[tt][u] + __half2float(bq.v[u]));
        *reinterpret_cast<P8*>(y + (((long long)n * H + oh) * W + q0 + tt) * C + c) = o;
    }
}

// K3: a block's input tile in shared memory as f32; each thread 1 row x COLS columns x 2
// channels. Block: CT channels (CT/2 threads across) x TR rows; tile TR x TW.
template <int K, int CT, int TR, int TW, int COLS>
__global__ void __launch_bounds__((CT / 2) * TR * (TW / COLS)) k3(const __half* __restrict__ x, const float* __restrict__ w, const __half* __restrict__ b,
                                          __half* __restrict__ y, int N, int H, int W, int C) {
    constexpr int P = K / 2, IH = TR + K - 1, IW = TW + K - 1;
    constexpr int THREADS = (CT / 2) * TR * (TW / COLS);
    __shared__ float2 tile[IH][IW][CT / 2];
    __shared__ float2 ws[K * K][CT / 2];
    const int tilesW = (W + TW - 1) / TW, tilesH = (H + TR - 1) / TR;
    int bid = blockIdx.x;
    const int ct = bid % (C / CT); bid /= C / CT;
    const int tw0 = (bid % tilesW) * TW; bid /= tilesW;
    const int th0 = (bid % tilesH) * TR; const int n = bid / tilesH;
    const int c0 = ct * CT;
    // load the input tile: 8 channels (one 16-byte pack) per load
    for (int e = threadIdx.x; e < IH * IW * (CT / 8); e += THREADS) {
        int cpk = e % (CT / 8); int rest = e / (CT / 8);
        int iwl = rest % IW, ihl = rest / IW;
        int ih = th0 + ihl - P, iw = tw0 + iwl - P;
        P8 q = load_or_zero(reinterpret_cast<const P8*>(x + (((long long)n * H + ih) * W + iw) * C + c0 + cpk * 8),
                            ih >= 0 && ih < H && iw >= 0 && iw < W);
#pragma unroll
        for (int u = 0; u < 4; ++u) tile[ihl][iwl][cpk * 4 + u] = make_float2(__half2float(q.v[2 * u]), __half2float(q.v[2 * u + 1]));
    }
    for (int e = threadIdx.x; e < K * K * (CT / 2); e += THREADS) {
        int cpair = e % (CT / 2), tap = e / (CT / 2);
        ws[tap][cpair] = *reinterpret_cast<const float2*>(w + tap * C + c0 + 2 * cpair);
    }
    __syncthreads();
    const int cpair = threadIdx.x % (CT / 2);
    int rest = threadIdx.x / (CT / 2);
    const int colg = rest % (TW / COLS), row = rest / (TW / COLS);
    const int oh = th0 + row, ow0 = tw0 + colg * COLS;
    if (oh >= H) return;
    float2 acc[COLS];
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) acc[tt] = make_float2(0.f, 0.f);
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
        float2 xr[COLS + K - 1];
#pragma unroll
        for (int col = 0; col < COLS + K - 1; ++col) xr[col] = tile[row + kh][colg * COLS + col][cpair];
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
            const float2 wv = ws[kh * K + kw][cpair];
#pragma unroll
            for (int tt = 0; tt < COLS; ++tt) {
                acc[tt].x = fmaf(xr[tt + kw].x, wv.x, acc[tt].x);
                acc[tt].y = fmaf(xr[tt + kw].y, wv.y, acc[tt].y);
            }
        }
    }
    const __half2 bq = *reinterpret_cast<const __half2*>(b + c0 + 2 * cpair);
    const float2 bf = __half22float2(bq);
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) {
        if (ow0 + tt >= W) break;
        *reinterpret_cast<__half2*>(y + (((long long)n * H + oh) * W + ow0 + tt) * C + c0 + 2 * cpair) =
            __floats2half2_rn(acc[tt].x + bf.x, acc[tt].y + bf.y);
    }
}


// K4: the input tile in shared memory as half2; each kernel row's taps in half2 (HFMA2),
// added to f32 accumulators after the row. 1 row x COLS columns x 2 channels per thread.
template <int K, int CT, int TR, int TW, int COLS>
__global__ void __launch_bounds__((CT / 2) * TR * (TW / COLS)) k4(const __half* __restrict__ x, const __half* __restrict__ w, const __half* __restrict__ b,
                                          __half* __restrict__ y, int N, int H, int W, int C) {
    constexpr int P = K / 2, IH = TR + K - 1, IW = TW + K - 1;
    constexpr int THREADS = (CT / 2) * TR * (TW / COLS);
    __shared__ __half2 tile[IH][IW][CT / 2];
    __shared__ __half2 ws[K * K][CT / 2];
    const int tilesW = (W + TW - 1) / TW, tilesH = (H + TR - 1) / TR;
    int bid = blockIdx.x;
    const int ct = bid % (C / CT); bid /= C / CT;
    const int tw0 = (bid % tilesW) * TW; bid /= tilesW;
    const int th0 = (bid % tilesH) * TR; const int n = bid / tilesH;
    const int c0 = ct * CT;
    for (int e = threadIdx.x; e < IH * IW * (CT / 8); e += THREADS) {
        int cpk = e % (CT / 8); int rest = e / (CT / 8);
        int iwl = rest % IW, ihl = rest / IW;
        int ih = th0 + ihl - P, iw = tw0 + iwl - P;
        *reinterpret_cast<Pack<__half2, 4>*>(&tile[ihl][iwl][cpk * 4]) = load_or_zero(
            reinterpret_cast<const Pack<__half2, 4>*>(x + (((long long)n * H + ih) * W + iw) * C + c0 + cpk * 8),
            ih >= 0 && ih < H && iw >= 0 && iw < W);
    }
    for (int e = threadIdx.x; e < K * K * (CT / 2); e += THREADS) {
        int cpair = e % (CT / 2), tap = e / (CT / 2);
        ws[tap][cpair] = *reinterpret_cast<const __half2*>(w + tap * C + c0 + 2 * cpair);
    }
    __syncthreads();
    const int cpair = threadIdx.x % (CT / 2);
    int rest = threadIdx.x / (CT / 2);
    const int colg = rest % (TW / COLS), row = rest / (TW / COLS);
    const int oh = th0 + row, ow0 = tw0 + colg * COLS;
    if (oh >= H) return;
    float2 acc[COLS];
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) acc[tt] = make_float2(0.f, 0.f);
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
        __half2 xr[COLS + K - 1];
#pragma unroll
        for (int col = 0; col < COLS + K - 1; ++col) xr[col] = tile[row + kh][colg * COLS + col][cpair];
        __half2 h[COLS];
#pragma unroll
        for (int tt = 0; tt < COLS; ++tt) h[tt] = __float2half2_rn(0.f);
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
            const __half2 wv = ws[kh * K + kw][cpair];
#pragma unroll
            for (int tt = 0; tt < COLS; ++tt) h[tt] = __hfma2(xr[tt + kw], wv, h[tt]);
        }
#pragma unroll
        for (int tt = 0; tt < COLS; ++tt) {
            const float2 f = __half22float2(h[tt]);
            acc[tt].x += f.x;
            acc[tt].y += f.y;
        }
    }
    const float2 bf = __half22float2(*reinterpret_cast<const __half2*>(b + c0 + 2 * cpair));
#pragma unroll
    for (int tt = 0; tt < COLS; ++tt) {
        if (ow0 + tt >= W) break;
        *reinterpret_cast<__half2*>(y + (((long long)n * H + oh) * W + ow0 + tt) * C + c0 + 2 * cpair) =
            __floats2half2_rn(acc[tt].x + bf.x, acc[tt].y + bf.y);
    }
}
