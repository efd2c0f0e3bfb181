#!/usr/bin/env bash
# The draw microbenchmark (benches/NOTES.md, thirty-second session): the shipped sampling
# kernel timed alone at 1 and 8 rows of 50,257 logits, then built with its marks
# (-DSAMPLE_TRACE). Run on a machine with nvcc and a GPU: bash benches/micro/sample_draw/run.sh.
# Or build the two binaries elsewhere with the same nvcc lines plus `-cudart static` (the
# nvidia-cuda-nvcc, -crt, -nvvm and -runtime wheels make a toolkit) and carry them.
set -e
cd "$(dirname "$0")"
nvcc -O3 -arch=sm_90a -std=c++17 -I../../../kernels draw.cu -o /tmp/fusec-sample-draw
/tmp/fusec-sample-draw 1
/tmp/fusec-sample-draw 8
nvcc -O3 -arch=sm_90a -std=c++17 -DSAMPLE_TRACE -I../../../kernels draw.cu -o /tmp/fusec-sample-draw-trace
/tmp/fusec-sample-draw-trace 1
