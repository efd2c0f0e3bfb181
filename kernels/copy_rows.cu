// Rows of 4- or 16-byte words copied from one strided layout to another (a decoder's new keys
// and values into their cache slot, `fusec::generate`): one thread a word. Pitches are in words.
// The runtime loads the PTX beside it (kernels/copy_rows.ptx, NVRTC 13.0, -arch=compute_75)
// without NVRTC; regenerate it from this file after a change.

#include "copy_rows.cuh"

// Several tensors of one geometry at once (a decoder's every cached key and value): tensor
// `blockIdx.y` from `sources[blockIdx.y]` to `targets[blockIdx.y]` (its first rows the offsets
// past them). Blocks past the `tensors` set up to two columns of inputs to one value
// each (a decoder's next position and the mask's next live slot) in the same launch.
extern "C" __global__ void fusec_copy_rows_many(const unsigned long long* __restrict__ sources,
                                                const unsigned long long* __restrict__ targets,
                                                unsigned long long rows, unsigned long long words,
                                                unsigned long long src_pitch, unsigned long long dst_pitch,
                                                unsigned long long src_offset, unsigned long long dst_offset,
                                                unsigned long long tensors, unsigned long long wide, ColumnSet s0,
                                                ColumnSet s1) {
    copy_rows_block(sources, targets, rows, words, src_pitch, dst_pitch, src_offset, dst_offset, tensors, wide, s0, s1,
                    blockIdx.y, blockIdx.x);
}
