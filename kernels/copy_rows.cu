// Rows of 4-byte words copied from one strided layout to another (a decoder's new keys and
// values into their cache slot, `fusec::generate`): one thread a word. Pitches are in words.
// The runtime loads the PTX beside it (kernels/copy_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.
extern "C" __global__ void fusec_copy_rows(const unsigned int* __restrict__ src, unsigned int* __restrict__ dst,
                                           unsigned long long rows, unsigned long long words,
                                           unsigned long long src_pitch, unsigned long long dst_pitch) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * words) return;
    const unsigned long long r = i / words, c = i - r * words;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
}
