// Top-k and top-p (nucleus) draws at a temperature from rows of logits, one block a row, so
// that only token ids leave the GPU. The same choice as the host's sampler
// (src/generate/sampling.rs, `Sampler::choose_with`): tokens ordered by logit, highest first,
// ties by id, NaNs left out; weights exp((logit - top) / temperature) in f64; top-k keeps the
// first k, top-p the shortest prefix whose weights reach p of the total (all of them where
// rounding never gets there); the draw u in [0, 1) of the row picks the first kept token whose
// running weight passes u times the kept weight (the last kept one where rounding runs out).
// Nothing is sorted: the kept set and the pick are found by searches over the logits'
// order-preserving 32-bit keys, four bits a step (`largest_from`): each step one pass over the
// row adding up the count or weight of each of the next digit's 16 values among the keys
// that share the digits found so far — eight passes where a bit-by-bit search took 32. Every
// sum is added in a fixed order (each thread's own, then lanes, then warps), so a row gives
// the same token every time.
//
// A row is one block, or with SAMPLE_CLUSTER = n > 1 (sm_90+) a cluster of n blocks, each
// block holding a contiguous n-th of the row: every block-wide sum, count and maximum is then
// also combined across the cluster (each block's value through distributed shared memory,
// added in rank order, so that every block of a row computes the same figures and takes the
// same way), and one block of the cluster sorts the few candidates or writes the pick. At
// batch 1 a single block used one of 132 multiprocessors for the ~30 passes over a
// 50,257-wide row (0.47 ms); a cluster spreads them over n.
//
// The runtime loads the PTX beside it without NVRTC (NVRTC 13.0): kernels/sample_rows.ptx
// (-arch=compute_75) and kernels/sample_rows_cluster.ptx (-arch=compute_90
// -DSAMPLE_CLUSTER=8); regenerate both from this file after a change.

#ifndef SAMPLE_CLUSTER
#define SAMPLE_CLUSTER 1
#endif
// Threads a block: 1,024 for a block a row; 512 for each block of a cluster (an eighth of the
// row each: fewer warps to reduce over a pass, and room for every sum in registers).
#if SAMPLE_CLUSTER > 1
#define THREADS 512
#else
#define THREADS 1024
#endif

// The cluster helpers of the generated kernels (cluster_rank, cluster_sync, cluster_map).
#include "fusec.cuh"
// The copy of a step's new keys and values (`fusec_sample_rows_copying`).
#include "copy_rows.cuh"

#if SAMPLE_CLUSTER > 1
#if !FUSEC_CLUSTERS
#error "SAMPLE_CLUSTER > 1 needs sm_90 or later (-arch=compute_90)"
#endif
using fusec::cluster_map;
using fusec::cluster_rank;
using fusec::cluster_sync;
#define SAMPLE_CLUSTER_DIMS __cluster_dims__(SAMPLE_CLUSTER, 1, 1)
#else
__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_sync() {}
#define SAMPLE_CLUSTER_DIMS
#endif

// Each block's `n` values at `v` (shared memory, n <= 16, the same in every thread) combined
// across the cluster, in rank order: value i added, or where bit i of `max_of` is set their
// maximum, back into `v`.
// `exchange` is shared room for 2 x 16 values, `phase` which half this exchange uses (flipped
// here): a block writes one half while another may still read the other from the exchange
// before, which the barrier between them has made safe. Ends synchronised.
__device__ void across(double* v, int n, unsigned max_of, double* exchange, int& phase) {
#if SAMPLE_CLUSTER > 1
    double* mine = exchange + 16 * phase;
    phase ^= 1;
    if ((int)threadIdx.x < n) mine[threadIdx.x] = v[threadIdx.x];
    cluster_sync();
    if ((int)threadIdx.x < n) {
        const bool max = ((max_of >> threadIdx.x) & 1u) != 0;
        // Every block's value requested before any is added (one wait on distributed shared
        // memory, not one a block), then added in rank order.
        double xs[SAMPLE_CLUSTER];
#pragma unroll
        for (unsigned r = 0; r < SAMPLE_CLUSTER; ++r) xs[r] = *cluster_map(mine + threadIdx.x, r);
        double acc = xs[0];
#pragma unroll
        for (unsigned r = 1; r < SAMPLE_CLUSTER; ++r) acc = max ? fmax(acc, xs[r]) : acc + xs[r];
        v[threadIdx.x] = acc;
    }
    __syncthreads();
#endif
}
// With -DSAMPLE_TRACE (benches/micro/sample_draw), the first block's first thread records the
// GPU's clock at the marks below into `sample_trace`; otherwise the marks are nothing.
#ifdef SAMPLE_TRACE
__device__ unsigned long long sample_trace[64];
#define SAMPLE_MARK(i)                                                                             \
    do {                                                                                           \
        if (blockIdx.x == 0 && threadIdx.x == 0) {                                                 \
            unsigned long long t_;                                                                 \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                 \
            sample_trace[(i)] = t_;                                                                \
        }                                                                                          \
    } while (0)
#else
#define SAMPLE_MARK(i)
#endif

// Kept sets of at most this many tokens (with the ties at their last key) are picked from a
// sorted copy in shared memory, as the host does, rather than by searches over the row.
#define CANDIDATES 1024

// A float's key: larger value, larger key; NaN has none (0 here, with `valid` false).
__device__ __forceinline__ unsigned int key_of(float v, bool& valid) {
    valid = !(v != v);
    const unsigned int u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float value_of(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ double block_sum(double v, double* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? scratch[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ unsigned long long block_count(unsigned long long v, unsigned long long* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? scratch[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ unsigned int block_max(unsigned int v, unsigned long long* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? (unsigned int)scratch[lane] : 0u;
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

struct Row {
    // This block's part of the row: `width` values from id `begin`.
    const float* x;
    // Each of its tokens' weight, written once a row (in shared memory, or the launch's
    // `weights`).
    double* w;
    unsigned long long width;
    unsigned long long begin;
    float top;
    double temperature;
};

// What combining across a cluster needs: shared room for `across` (2 x 16 exchanged values,
// 16 results) and which half of the exchange is next. Without a cluster, nothing.
struct Cluster {
    double* exchange;
    double* value;
    int phase;
};

// `N` values every thread of the block holds (N <= 16), combined over the row's blocks in one
// exchange (value i added, or where bit i of `max_of` is set the maximum): the row's figures,
// in every thread of every block.
template <int N>
__device__ void row_totals(double (&values)[N], unsigned max_of, Cluster& c) {
#if SAMPLE_CLUSTER > 1
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < N; ++i) c.value[i] = values[i];
    }
    __syncthreads();
    across(c.value, N, max_of, c.exchange, c.phase);
#pragma unroll
    for (int i = 0; i < N; ++i) values[i] = c.value[i];
    __syncthreads();
#endif
}

// One value every thread of the block holds, combined over the row's blocks (added, or the
// maximum).
__device__ double row_total(double block_value, bool max_of, Cluster& c) {
    double v[1] = {block_value};
    row_totals(v, max_of ? 1u : 0u, c);
    return v[0];
}

__device__ __forceinline__ double weight(const Row& r, float v) {
    return exp(((double)v - (double)r.top) / r.temperature);
}

// The weight of the row's tokens with a key of at least `t`.
__device__ double weight_from(const Row& r, unsigned long long t, double* scratch, Cluster& c) {
    double w = 0.0;
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
        bool valid;
        const float v = r.x[i];
        const unsigned int k = key_of(v, valid);
        if (valid && k >= t) w += r.w[i];
    }
    return row_total(block_sum(w, scratch), false, c);
}

// Three figures of the row at key `t`, from one pass and one exchange: the tokens with a key
// of at least `t`, those with a key above it, and the weight of those above it (summed in the
// order `weight_from` sums it). `scratch`: room for 3 x 32 values.
struct Figures {
    unsigned long long from;
    unsigned long long above;
    double weight_above;
};

__device__ Figures figures_at(const Row& r, unsigned long long t, double* scratch, Cluster& c) {
    unsigned long long from = 0, above = 0;
    double w = 0.0;
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
        bool valid;
        const unsigned int k = key_of(r.x[i], valid);
        if (valid && k >= t) {
            from += 1;
            if (k > t) {
                above += 1;
                w += r.w[i];
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        from += __shfl_xor_sync(0xffffffffu, from, o);
        above += __shfl_xor_sync(0xffffffffu, above, o);
        w += __shfl_xor_sync(0xffffffffu, w, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = (double)from;
        scratch[32 + warp] = (double)above;
        scratch[64 + warp] = w;
    }
    __syncthreads();
    const bool mine = lane < (int)(blockDim.x >> 5);
    double v[3] = {mine ? scratch[lane] : 0.0, mine ? scratch[32 + lane] : 0.0, mine ? scratch[64 + lane] : 0.0};
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int j = 0; j < 3; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
    }
    // Counts are at most a row's width: exact in a double.
    row_totals(v, 0u, c);
    return Figures{(unsigned long long)v[0], (unsigned long long)v[1], v[2]};
}

// One halving step of a warp's sums of `2 * HALF` values a lane: lanes `2 * HALF` apart
// exchange the halves they do not keep (the upper lane keeps the upper half) and add them, so
// that `acc[0..HALF]` holds the kept half summed over both lanes.
template <int HALF>
__device__ __forceinline__ void fold(double* acc, int lane) {
    const bool upper = (lane & (2 * HALF)) != 0;
#pragma unroll
    for (int j = 0; j < HALF; ++j) {
        const double keep = upper ? acc[j + HALF] : acc[j];
        const double send = upper ? acc[j] : acc[j + HALF];
        acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * HALF);
    }
}

// The count (`weights` false) or weight of the row's keys of each of the 16 values of the
// digit at `shift` among the keys whose digits above it are `prefix`'s, into `digit[0..16]`;
// `warps` is room for 32 x 16 partial sums. Ends synchronised.
__device__ void digit_sums(const Row& r, bool weights, unsigned int prefix, int shift, double* digit, double* warps,
                           Cluster& c) {
    double acc[16];
#pragma unroll
    for (int d = 0; d < 16; ++d) acc[d] = 0.0;
    const unsigned int high = shift == 28 ? 0u : prefix >> (shift + 4);
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
        bool valid;
        const unsigned int key = key_of(r.x[i], valid);
        if (!valid || (shift != 28 && (key >> (shift + 4)) != high)) continue;
        const unsigned int d = (key >> shift) & 15u;
        const double v = weights ? r.w[i] : 1.0;
#pragma unroll
        for (int b = 0; b < 16; ++b) acc[b] += b == (int)d ? v : 0.0;
    }
    // The warp's 16 sums, halved four times between lanes 16, 8, 4 and 2 apart (each lane
    // keeping the half its lane bit says), then added between neighbours: lanes 2d and 2d + 1
    // hold digit d's sum over the warp (15 exchanges where 16 full reductions took 80).
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    fold<8>(acc, lane);
    fold<4>(acc, lane);
    fold<2>(acc, lane);
    fold<1>(acc, lane);
    acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 1);
    if ((lane & 1) == 0) warps[warp * 16 + (lane >> 1)] = acc[0];
    __syncthreads();
    // Then warp d adds digit d's sums of the block's warps, a warp's lane each.
    if (warp < 16) {
        double v = lane < (int)(blockDim.x >> 5) ? warps[lane * 16 + warp] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) digit[warp] = v;
    }
    __syncthreads();
    across(digit, 16, false, c.exchange, c.phase);
}

// The largest t (0 where there is none) for which `holds` is true of the count (or weight)
// of the keys from t, `holds` being true for a count or weight no less than one it holds for:
// digit by digit from the highest, each the largest value for which it still holds.
template <class Holds>
__device__ unsigned long long largest_from(const Row& r, bool weights, Holds holds, double* digit, double* warps,
                                           Cluster& c) {
    unsigned int prefix = 0;
    // The count or weight of the keys above every key with the digits found so far.
    double above = 0.0;
    for (int shift = 28; shift >= 0; shift -= 4) {
        digit_sums(r, weights, prefix, shift, digit, warps, c);
        SAMPLE_MARK(32 + (weights ? 8 : 0) + (28 - shift) / 4);
        unsigned int chosen = 0;
        double from = above, beyond = above;
        for (int d = 15; d >= 0; --d) {
            from += digit[d];
            if (holds(from)) {
                chosen = (unsigned int)d;
                break;
            }
            beyond = from;
        }
        // Where it holds for no value, the digit is 0 (as a bit-by-bit search leaves it) and
        // every key of a larger digit is above.
        above = beyond;
        prefix |= chosen << shift;
        __syncthreads();
    }
    return prefix;
}

// mode 1: top-k (k); mode 2: top-p (p). Rows of `width`, `row_pitch` apart from `x`, each one
// block (a cluster of SAMPLE_CLUSTER blocks); `draws`: one u in [0, 1) a row; `weights`: room
// for `width` doubles a row, each token's weight computed once there (the searches read it
// rather than computing exp again); `shared_row` 1: each block's part of the row is read into
// dynamic shared memory first (`ceil(width / SAMPLE_CLUSTER)` floats), and every pass reads
// it there; 2: its weights are kept there too, after the row (from the next multiple of two
// floats), rather than in `weights` (a pass then reads no memory outside the multiprocessor:
// reading them from L2, one load an element waited for before the next, was most of a
// top-p draw's time). The id chosen goes to `out[row]` and, where `host` is not null, to
// `host[row]` (page-locked host memory mapped for the device); `draws` may be such memory
// too.
__device__ __forceinline__ void sample_row(const float* __restrict__ x, long long* __restrict__ out,
                                           long long* host, unsigned long long width, unsigned long long row_pitch,
                                           const double* __restrict__ draws, double* __restrict__ weights,
                                           int shared_row, int mode, unsigned long long k, double p,
                                           double temperature) {
    __shared__ double sums[32];
    __shared__ unsigned long long counts[32];
    __shared__ unsigned long long before[THREADS];
    __shared__ double digit[16];
    __shared__ double warp_digits[32 * 16];
#if SAMPLE_CLUSTER > 1
    __shared__ double exchange[32];
    __shared__ double value[16];
    Cluster c{exchange, value, 0};
#else
    Cluster c{nullptr, nullptr, 0};
#endif
    extern __shared__ float row_copy[];
    const unsigned rank = cluster_rank();
    const unsigned long long row = blockIdx.x / SAMPLE_CLUSTER;
    const unsigned long long part = (width + SAMPLE_CLUSTER - 1) / SAMPLE_CLUSTER;
    const unsigned long long begin = min(width, rank * part), end = min(width, begin + part);
    Row r{x + row * row_pitch + begin, weights + row * width + begin, end - begin, begin, 0.0f, temperature};
    if (shared_row) {
        for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) row_copy[i] = r.x[i];
        __syncthreads();
        r.x = row_copy;
        if (shared_row == 2) r.w = reinterpret_cast<double*>(row_copy + ((part + 1) & ~1ull));
    }
    SAMPLE_MARK(0);
    // The id chosen, where it goes.
    auto choose = [&](long long id) {
        out[row] = id;
        if (host != nullptr) host[row] = id;
    };
    // The largest and least keys; none valid: token 0.
    unsigned int best = 0, least = 0xffffffffu;
    unsigned long long valid_count = 0;
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
        bool valid;
        const unsigned int key = key_of(r.x[i], valid);
        if (valid) {
            best = max(best, key);
            least = min(least, key);
            valid_count += 1;
        }
    }
    // The three in one exchange: two maxima, a count.
    double first[3] = {(double)block_max(best, counts), (double)block_max(~least, counts),
                       (double)block_count(valid_count, counts)};
    SAMPLE_MARK(1);
    row_totals(first, 3u, c);
    SAMPLE_MARK(2);
    best = (unsigned int)first[0];
    least = ~(unsigned int)first[1];
    valid_count = (unsigned long long)first[2];
    if (valid_count == 0) {
        if (threadIdx.x == 0 && rank == 0) choose(0);
        cluster_sync();
        return;
    }
    r.top = value_of(best);
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) r.w[i] = weight(r, r.x[i]);
    __syncthreads();
    SAMPLE_MARK(3);
    // The kept set: every key above `last`, and the first `ties` (by id) of the keys equal to
    // it (all of them where neither search runs); `at_last`: the figures at `last`.
    unsigned long long last = least, ties = 0;
    bool found = false;
    Figures at_last{0, 0, 0.0};
    if (mode == 1 && k < valid_count) {
        // The largest t with at least k keys from it: the k-th largest key.
        const double kk = (double)k;
        const unsigned long long t =
            largest_from(r, false, [kk](double n) { return n >= kk; }, digit, warp_digits, c);
        last = t;
        at_last = figures_at(r, last, warp_digits, c);
        found = true;
        ties = k - at_last.above;
    } else if (mode == 2) {
        const double total = weight_from(r, 0, sums, c);
        SAMPLE_MARK(4);
        // The largest t whose keys from it hold at least p of the weight (an existing key);
        // where rounding keeps even all of them under p, all are kept.
        if (total / total >= p) {
            const unsigned long long t =
                largest_from(r, true, [total, p](double w) { return w / total >= p; }, digit, warp_digits, c);
            last = t < least ? least : t;
            SAMPLE_MARK(5);
            at_last = figures_at(r, last, warp_digits, c);
            SAMPLE_MARK(6);
            found = true;
            const unsigned long long equal = at_last.from - at_last.above;
            const double above = at_last.weight_above, w = weight(r, value_of((unsigned int)last));
            // The fewest ties that reach p (each of weight w), at least one, at most all.
            unsigned long long j = equal;
            if (w > 0.0) {
                const double need = ceil((p * total - above) / w);
                j = need < 1.0 ? 1ull : (need > (double)equal ? equal : (unsigned long long)need);
                while (j > 1 && (above + (double)(j - 1) * w) / total >= p) --j;
                while (j < equal && (above + (double)j * w) / total < p) ++j;
            }
            ties = j;
        }
    }
    if (!found) {
        at_last = figures_at(r, last, warp_digits, c);
        ties = valid_count - at_last.above;
    }
    // Few candidates (every key from `last`): sort them as the host does (key down, id up),
    // add the kept ones' weights in that order and walk them with the draw.
    __shared__ unsigned int cand_key[CANDIDATES];
    __shared__ unsigned int cand_id[CANDIDATES];
    __shared__ double cand_w[CANDIDATES];
    __shared__ unsigned int cand_n;
    const unsigned long long candidates = at_last.from;
    SAMPLE_MARK(11);
    if (candidates <= CANDIDATES) {
        const unsigned int kept_n = (unsigned int)(at_last.above + ties);
        if (threadIdx.x == 0) cand_n = 0;
        __syncthreads();
        for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
            bool valid;
            const unsigned int key = key_of(r.x[i], valid);
            if (valid && key >= last) {
                const unsigned int at = atomicAdd(&cand_n, 1u);
                cand_key[at] = key;
                cand_id[at] = (unsigned int)(r.begin + i);
            }
        }
        __syncthreads();
#if SAMPLE_CLUSTER > 1
        // The first block gathers every block's candidates after its own (their order does
        // not matter: the sort below orders them wholly), then the others may leave.
        cluster_sync();
        if (rank == 0) {
            // Every block's count first (all requested at once), then each thread's share of
            // the concatenation, from whichever block holds it.
            unsigned int n[SAMPLE_CLUSTER], at[SAMPLE_CLUSTER + 1];
#pragma unroll
            for (unsigned int from = 1; from < SAMPLE_CLUSTER; ++from) n[from] = *cluster_map(&cand_n, from);
            at[1] = cand_n;
#pragma unroll
            for (unsigned int from = 1; from < SAMPLE_CLUSTER; ++from) at[from + 1] = at[from] + n[from];
            for (unsigned int i = cand_n + threadIdx.x; i < at[SAMPLE_CLUSTER]; i += blockDim.x) {
                unsigned int from = 1, first = at[1];
#pragma unroll
                for (unsigned int f = 2; f < SAMPLE_CLUSTER; ++f) {
                    if (i >= at[f]) {
                        from = f;
                        first = at[f];
                    }
                }
                cand_key[i] = cluster_map(cand_key, from)[i - first];
                cand_id[i] = cluster_map(cand_id, from)[i - first];
            }
        }
        cluster_sync();
        if (rank != 0) return;
#endif
        unsigned int size = 1;
        while (size < (unsigned int)candidates) size <<= 1;
        for (unsigned int i = (unsigned int)candidates + threadIdx.x; i < size; i += blockDim.x) {
            cand_key[i] = 0;
            cand_id[i] = 0xffffffffu;
        }
        __syncthreads();
        // Bitonic sort: `a` before `b` when its key is larger, or equal with a smaller id.
        for (unsigned int k2 = 2; k2 <= size; k2 <<= 1) {
            for (unsigned int j = k2 >> 1; j > 0; j >>= 1) {
                for (unsigned int i = threadIdx.x; i < size; i += blockDim.x) {
                    const unsigned int l = i ^ j;
                    if (l > i) {
                        const bool first = (i & k2) == 0;
                        const unsigned int ka = cand_key[i], kb = cand_key[l], ia = cand_id[i], ib = cand_id[l];
                        const bool b_before_a = kb > ka || (kb == ka && ib < ia);
                        if (first == b_before_a) {
                            cand_key[i] = kb;
                            cand_key[l] = ka;
                            cand_id[i] = ib;
                            cand_id[l] = ia;
                        }
                    }
                }
                __syncthreads();
            }
        }
        SAMPLE_MARK(12);
        for (unsigned int i = threadIdx.x; i < kept_n; i += blockDim.x) cand_w[i] = weight(r, value_of(cand_key[i]));
        __syncthreads();
        if (threadIdx.x == 0) {
            double sum = 0.0;
            for (unsigned int i = 0; i < kept_n; ++i) sum += cand_w[i];
            double u = draws[row] * sum;
            long long pick = (long long)cand_id[kept_n - 1];
            for (unsigned int i = 0; i < kept_n; ++i) {
                if (u < cand_w[i]) {
                    pick = (long long)cand_id[i];
                    break;
                }
                u -= cand_w[i];
            }
            choose(pick);
            SAMPLE_MARK(13);
        }
        return;
    }
    const double w_last = weight(r, value_of((unsigned int)last));
    const double kept = at_last.weight_above + (double)ties * w_last;
    const double target = draws[row] * kept;
    // The pick's key: the largest t whose keys from it weigh more than the target, where that
    // is above `last` (every token from it kept); else `last`.
    unsigned long long t =
        largest_from(r, true, [target](double w) { return w > target; }, digit, warp_digits, c);
    if (t <= last) t = last;
    SAMPLE_MARK(7);
    const Figures at_t = figures_at(r, t, warp_digits, c);
    SAMPLE_MARK(8);
    const double above = at_t.weight_above, w = weight(r, value_of((unsigned int)t));
    const unsigned long long equal = at_t.from - at_t.above;
    const unsigned long long available = t == last ? ties : equal;
    unsigned long long j = 0;
    if (w > 0.0) {
        // The host subtracts w per tie until the rest is under it.
        double rest = target - above;
        j = rest <= 0.0 ? 0ull : (unsigned long long)floor(rest / w);
    } else {
        j = available;
    }
    if (j + 1 > available) j = available - 1;
    // The j-th token (by id) with key t: each thread counts its own run of ids of the block's
    // part, the blocks before this one's counted across the cluster.
    const unsigned long long chunk = (r.width + blockDim.x - 1) / blockDim.x;
    const unsigned long long from = threadIdx.x * chunk, to = min(r.width, from + chunk);
    unsigned long long mine = 0;
    for (unsigned long long i = from; i < to; ++i) {
        bool valid;
        const unsigned int key = key_of(r.x[i], valid);
        mine += (valid && key == t) ? 1ull : 0ull;
    }
    before[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long run = 0;
        for (unsigned int i = 0; i < blockDim.x; ++i) {
            const unsigned long long n = before[i];
            before[i] = run;
            run += n;
        }
        sums[0] = (double)run;
    }
    __syncthreads();
    unsigned long long earlier = 0;
#if SAMPLE_CLUSTER > 1
    // Each block's count of key t, then the sum of those before this block.
    if (threadIdx.x == 0) exchange[16 * c.phase] = sums[0];
    cluster_sync();
    for (unsigned int b = 0; b < rank; ++b) earlier += (unsigned long long)*cluster_map(exchange + 16 * c.phase, b);
#endif
    const unsigned long long start = earlier + before[threadIdx.x];
    if (j >= start && j < start + mine) {
        unsigned long long seen = start;
        for (unsigned long long i = from; i < to; ++i) {
            bool valid;
            const unsigned int key = key_of(r.x[i], valid);
            if (valid && key == t) {
                if (seen == j) {
                    choose((long long)(r.begin + i));
                    break;
                }
                ++seen;
            }
        }
    }
    SAMPLE_MARK(9);
    // No block leaves while another may still read its shared memory.
    cluster_sync();
    SAMPLE_MARK(10);
}

extern "C" __global__ void SAMPLE_CLUSTER_DIMS __launch_bounds__(THREADS) fusec_sample_rows(
    const float* __restrict__ x, long long* __restrict__ out, long long* host, unsigned long long width,
    unsigned long long row_pitch, const double* __restrict__ draws, double* __restrict__ weights, int shared_row,
    int mode, unsigned long long k, double p, double temperature) {
    sample_row(x, out, host, width, row_pitch, draws, weights, shared_row, mode, k, p, temperature);
}

// A decoding step's draws and the copies after it in one launch (one launch's wait the fewer
// a step): the first `rows` rows' blocks (clusters) draw; the blocks after them, whole
// clusters of their own that never meet a cluster barrier, run `copy_rows_block` (block
// `copy_blocks` a tensor, then the column sets'), which neither reads nor writes what the
// draws do.
extern "C" __global__ void SAMPLE_CLUSTER_DIMS __launch_bounds__(THREADS) fusec_sample_rows_copying(
    const float* __restrict__ x, long long* __restrict__ out, long long* host, unsigned long long width,
    unsigned long long row_pitch, const double* __restrict__ draws, double* __restrict__ weights, int shared_row,
    int mode, unsigned long long k, double p, double temperature, unsigned long long rows,
    const unsigned long long* __restrict__ sources, const unsigned long long* __restrict__ targets,
    unsigned long long copy_rows, unsigned long long words, unsigned long long src_pitch,
    unsigned long long dst_pitch, unsigned long long src_offset, unsigned long long dst_offset,
    unsigned long long tensors, unsigned long long wide, ColumnSet s0, ColumnSet s1, unsigned long long copy_blocks) {
    const unsigned long long drawing = rows * SAMPLE_CLUSTER;
    if (blockIdx.x < drawing) {
        sample_row(x, out, host, width, row_pitch, draws, weights, shared_row, mode, k, p, temperature);
        return;
    }
    const unsigned long long c = blockIdx.x - drawing, tensor = c / copy_blocks;
    if (tensor <= tensors)
        copy_rows_block(sources, targets, copy_rows, words, src_pitch, dst_pitch, src_offset, dst_offset, tensors,
                        wide, s0, s1, tensor, c - tensor * copy_blocks);
}
