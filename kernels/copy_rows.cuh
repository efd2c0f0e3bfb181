// The copy of rows of 4-byte words and the column sets of `copy_rows.cu`, as device functions:
// that kernel runs them alone, `fusec_argmax_rows_copying` (argmax_rows.cu) beside a step's
// greedy choice.
#pragma once

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

// A column set: its first row's address, the bytes from row to row, the rows, the value's
// bytes (little-endian, in the low bytes) and the element's size.
struct ColumnSet {
    unsigned long long address, pitch, rows, bits, bytes;
};

// Block `tensor` (x: `block`) of a copy of several tensors of one geometry: tensor `tensor`
// from `sources[tensor]` to `targets[tensor]`, its first rows `src_offset` and `dst_offset`
// words past them, one thread a word — 16 bytes where `wide` is not 0 (every row, pitch,
// offset and base a multiple of 16 bytes: a quarter of the threads), else 4; the blocks past
// the `tensors` set `s0` and `s1` (a decoder's next position and the mask's next live slot).
// Pitches and offsets are in words: the offsets are arguments, so that the base arrays stay
// the same from step to step (a decoder's cache slot moves on every step; its tensors do not).
__device__ __forceinline__ void copy_rows_block(const unsigned long long* __restrict__ sources,
                                                const unsigned long long* __restrict__ targets,
                                                unsigned long long rows, unsigned long long words,
                                                unsigned long long src_pitch, unsigned long long dst_pitch,
                                                unsigned long long src_offset, unsigned long long dst_offset,
                                                unsigned long long tensors, unsigned long long wide,
                                                const ColumnSet& s0, const ColumnSet& s1, unsigned long long tensor,
                                                unsigned long long block) {
    const unsigned long long i = block * blockDim.x + threadIdx.x;
    if (tensor >= tensors) {
        set_element(s0.address, s0.pitch, s0.rows, s0.bits, s0.bytes, i);
        set_element(s1.address, s1.pitch, s1.rows, s1.bits, s1.bytes, i);
        return;
    }
    if (i >= rows * words) return;
    const unsigned long long r = i / words, c = i - r * words;
    const unsigned long long from = src_offset + r * src_pitch + c, to = dst_offset + r * dst_pitch + c;
    if (wide != 0) {
        reinterpret_cast<uint4*>(targets[tensor])[to] = reinterpret_cast<const uint4*>(sources[tensor])[from];
    } else {
        reinterpret_cast<unsigned int*>(targets[tensor])[to] = reinterpret_cast<const unsigned int*>(sources[tensor])[from];
    }
}
