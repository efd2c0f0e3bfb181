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
// The runtime loads the PTX beside it (kernels/sample_rows.ptx, NVRTC 13.0,
// -arch=compute_75) without NVRTC; regenerate it from this file after a change.

#define THREADS 1024
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
    const float* x;
    // Each token's weight, written once a row (`weights` scratch of the launch).
    double* w;
    unsigned long long width;
    float top;
    double temperature;
};

__device__ __forceinline__ double weight(const Row& r, float v) {
    return exp(((double)v - (double)r.top) / r.temperature);
}

// Tokens with a key of at least `t` (t = 2^32: none).
__device__ unsigned long long count_from(const Row& r, unsigned long long t, unsigned long long* scratch) {
    unsigned long long n = 0;
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
        bool valid;
        const unsigned int k = key_of(r.x[i], valid);
        n += (valid && k >= t) ? 1ull : 0ull;
    }
    return block_count(n, scratch);
}

// The weight of the tokens with a key of at least `t`.
__device__ double weight_from(const Row& r, unsigned long long t, double* scratch) {
    double w = 0.0;
    for (unsigned long long i = threadIdx.x; i < r.width; i += blockDim.x) {
        bool valid;
        const float v = r.x[i];
        const unsigned int k = key_of(v, valid);
        if (valid && k >= t) w += r.w[i];
    }
    return block_sum(w, scratch);
}

// The count (`weights` false) or weight of the keys of each of the 16 values of the digit at
// `shift` among the keys whose digits above it are `prefix`'s, into `digit[0..16]`; `warps`
// is room for 32 x 16 partial sums. Ends synchronised.
__device__ void digit_sums(const Row& r, bool weights, unsigned int prefix, int shift, double* digit, double* warps) {
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
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int b = 0; b < 16; ++b) {
        double v = acc[b];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) warps[warp * 16 + b] = v;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        double v = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v += warps[w * 16 + threadIdx.x];
        digit[threadIdx.x] = v;
    }
    __syncthreads();
}

// The largest t (0 where there is none) for which `holds` is true of the count (or weight)
// of the keys from t, `holds` being true for a count or weight no less than one it holds for:
// digit by digit from the highest, each the largest value for which it still holds.
template <class Holds>
__device__ unsigned long long largest_from(const Row& r, bool weights, Holds holds, double* digit, double* warps) {
    unsigned int prefix = 0;
    // The count or weight of the keys above every key with the digits found so far.
    double above = 0.0;
    for (int shift = 28; shift >= 0; shift -= 4) {
        digit_sums(r, weights, prefix, shift, digit, warps);
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

// mode 1: top-k (k); mode 2: top-p (p). Rows of `width`, `row_pitch` apart from `x`; `draws`:
// one u in [0, 1) a row; `weights`: room for `width` doubles a row, each token's weight
// computed once there (the searches read it rather than computing exp again); `shared_row`:
// the row is read into dynamic shared memory (`width` floats) first, and every pass reads it
// there.
extern "C" __global__ void __launch_bounds__(THREADS) fusec_sample_rows(
    const float* __restrict__ x, long long* __restrict__ out, unsigned long long width,
    unsigned long long row_pitch, const double* __restrict__ draws, double* __restrict__ weights, int shared_row,
    int mode, unsigned long long k, double p, double temperature) {
    __shared__ double sums[32];
    __shared__ unsigned long long counts[32];
    __shared__ unsigned long long before[THREADS];
    __shared__ double digit[16];
    __shared__ double warp_digits[32 * 16];
    extern __shared__ float row_copy[];
    Row r{x + (unsigned long long)blockIdx.x * row_pitch, weights + (unsigned long long)blockIdx.x * width, width,
          0.0f, temperature};
    if (shared_row) {
        for (unsigned long long i = threadIdx.x; i < width; i += blockDim.x) row_copy[i] = r.x[i];
        __syncthreads();
        r.x = row_copy;
    }
    // The largest and least keys; none valid: token 0.
    unsigned int best = 0, least = 0xffffffffu;
    unsigned long long valid_count = 0;
    for (unsigned long long i = threadIdx.x; i < width; i += blockDim.x) {
        bool valid;
        const unsigned int key = key_of(r.x[i], valid);
        if (valid) {
            best = max(best, key);
            least = min(least, key);
            valid_count += 1;
        }
    }
    best = block_max(best, counts);
    least = ~block_max(~least, counts);
    valid_count = block_count(valid_count, counts);
    if (valid_count == 0) {
        if (threadIdx.x == 0) out[blockIdx.x] = 0;
        return;
    }
    r.top = value_of(best);
    for (unsigned long long i = threadIdx.x; i < width; i += blockDim.x) r.w[i] = weight(r, r.x[i]);
    __syncthreads();
    // The kept set: every key above `last`, and the first `ties` (by id) of the keys equal to
    // it. To begin with, all of them.
    unsigned long long last = least, ties = valid_count - count_from(r, (unsigned long long)least + 1, counts);
    if (mode == 1 && k < valid_count) {
        // The largest t with at least k keys from it: the k-th largest key.
        const double kk = (double)k;
        const unsigned long long t =
            largest_from(r, false, [kk](double n) { return n >= kk; }, digit, warp_digits);
        last = t;
        ties = k - count_from(r, t + 1, counts);
    } else if (mode == 2) {
        const double total = weight_from(r, 0, sums);
        // The largest t whose keys from it hold at least p of the weight (an existing key);
        // where rounding keeps even all of them under p, all are kept.
        if (total / total >= p) {
            const unsigned long long t =
                largest_from(r, true, [total, p](double w) { return w / total >= p; }, digit, warp_digits);
            last = t < least ? least : t;
            const unsigned long long equal = count_from(r, last, counts) - count_from(r, last + 1, counts);
            const double above = weight_from(r, last + 1, sums), w = weight(r, value_of((unsigned int)last));
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
    // Few candidates (every key from `last`): sort them as the host does (key down, id up),
    // add the kept ones' weights in that order and walk them with the draw.
    __shared__ unsigned int cand_key[CANDIDATES];
    __shared__ unsigned int cand_id[CANDIDATES];
    __shared__ double cand_w[CANDIDATES];
    __shared__ unsigned int cand_n;
    const unsigned long long candidates = count_from(r, last, counts);
    if (candidates <= CANDIDATES) {
        const unsigned int kept_n = (unsigned int)(count_from(r, last + 1, counts) + ties);
        if (threadIdx.x == 0) cand_n = 0;
        __syncthreads();
        for (unsigned long long i = threadIdx.x; i < width; i += blockDim.x) {
            bool valid;
            const unsigned int key = key_of(r.x[i], valid);
            if (valid && key >= last) {
                const unsigned int at = atomicAdd(&cand_n, 1u);
                cand_key[at] = key;
                cand_id[at] = (unsigned int)i;
            }
        }
        __syncthreads();
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
        for (unsigned int i = threadIdx.x; i < kept_n; i += blockDim.x) cand_w[i] = weight(r, value_of(cand_key[i]));
        __syncthreads();
        if (threadIdx.x == 0) {
            double sum = 0.0;
            for (unsigned int i = 0; i < kept_n; ++i) sum += cand_w[i];
            double u = draws[blockIdx.x] * sum;
            long long pick = (long long)cand_id[kept_n - 1];
            for (unsigned int i = 0; i < kept_n; ++i) {
                if (u < cand_w[i]) {
                    pick = (long long)cand_id[i];
                    break;
                }
                u -= cand_w[i];
            }
            out[blockIdx.x] = pick;
        }
        return;
    }
    const double w_last = weight(r, value_of((unsigned int)last));
    const double kept = weight_from(r, last + 1, sums) + (double)ties * w_last;
    const double target = draws[blockIdx.x] * kept;
    // The pick's key: the largest t whose keys from it weigh more than the target, where that
    // is above `last` (every token from it kept); else `last`.
    unsigned long long t = largest_from(r, true, [target](double w) { return w > target; }, digit, warp_digits);
    if (t <= last) t = last;
    const double above = weight_from(r, t + 1, sums), w = weight(r, value_of((unsigned int)t));
    const unsigned long long equal = count_from(r, t, counts) - count_from(r, t + 1, counts);
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
    // The j-th token (by id) with key t: each thread counts its own run of ids.
    const unsigned long long chunk = (width + blockDim.x - 1) / blockDim.x;
    const unsigned long long from = threadIdx.x * chunk, to = min(width, from + chunk);
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
    }
    __syncthreads();
    const unsigned long long start = before[threadIdx.x];
    if (j >= start && j < start + mine) {
        unsigned long long seen = start;
        for (unsigned long long i = from; i < to; ++i) {
            bool valid;
            const unsigned int key = key_of(r.x[i], valid);
            if (valid && key == t) {
                if (seen == j) {
                    out[blockIdx.x] = (long long)i;
                    break;
                }
                ++seen;
            }
        }
    }
}
