// Rows of 4-byte words copied from one strided layout to another (a decoder's new keys and
// values into their cache slot, `fusec::generate`): one thread a word. Pitches are in words.
// The runtime loads the PTX beside it (kernels/copy_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.

// Several tensors of one geometry at once (a decoder's every cached key and value): tensor
// `blockIdx.y` from `sources[blockIdx.y]` to `targets[blockIdx.y]`, each base already past its
// first row's offset.
extern "C" __global__ void fusec_copy_rows_many(const unsigned long long* __restrict__ sources,
                                                const unsigned long long* __restrict__ targets,
                                                unsigned long long rows, unsigned long long words,
                                                unsigned long long src_pitch, unsigned long long dst_pitch) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * words) return;
    const unsigned long long r = i / words, c = i - r * words;
    const unsigned int* src = reinterpret_cast<const unsigned int*>(sources[blockIdx.y]);
    unsigned int* dst = reinterpret_cast<unsigned int*>(targets[blockIdx.y]);
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
}
