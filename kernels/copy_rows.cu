// Rows of 4-byte words copied from one strided layout to another (a decoder's new keys and
// values into their cache slot, `fusec::generate`): one thread a word. Pitches are in words.
// The runtime loads the PTX beside it (kernels/copy_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.

// One element of `bytes` (1, 2, 4 or 8) set to the low bytes of `bits` in row `r` of a column
// (`rows` rows, `pitch` bytes apart from `address`).
__device__ __forceinline__ void set_element(unsigned long long address, unsigned long long pitch,
                                            unsigned long long rows, unsigned long long bits,
                                            unsigned long long bytes, unsigned long long r) {
    if (r >= rows) return;
    char* p = reinterpret_cast<char*>(address + r * pitch);
    switch (bytes) {
        case 1: *reinterpret_cast<unsigned char*>(p) = (unsigned char)bits; break;
        case 2: *reinterpret_cast<unsigned short*>(p) = (unsigned short)bits; break;
        case 4: *reinterpret_cast<unsigned int*>(p) = (unsigned int)bits; break;
        default: *reinterpret_cast<unsigned long long*>(p) = bits; break;
    }
}

// Several tensors of one geometry at once (a decoder's every cached key and value): tensor
// `blockIdx.y` from `sources[blockIdx.y]` to `targets[blockIdx.y]`, each base already past its
// first row's offset. Blocks past the `tensors` set up to two columns of inputs to one value
// each (a decoder's next position and the mask's next live slot) in the same launch.
extern "C" __global__ void fusec_copy_rows_many(const unsigned long long* __restrict__ sources,
                                                const unsigned long long* __restrict__ targets,
                                                unsigned long long rows, unsigned long long words,
                                                unsigned long long src_pitch, unsigned long long dst_pitch,
                                                unsigned long long tensors, unsigned long long a0,
                                                unsigned long long p0, unsigned long long r0,
                                                unsigned long long v0, unsigned long long b0,
                                                unsigned long long a1, unsigned long long p1,
                                                unsigned long long r1, unsigned long long v1,
                                                unsigned long long b1) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.y >= tensors) {
        set_element(a0, p0, r0, v0, b0, i);
        set_element(a1, p1, r1, v1, b1, i);
        return;
    }
    if (i >= rows * words) return;
    const unsigned long long r = i / words, c = i - r * words;
    const unsigned int* src = reinterpret_cast<const unsigned int*>(sources[blockIdx.y]);
    unsigned int* dst = reinterpret_cast<unsigned int*>(targets[blockIdx.y]);
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
}
