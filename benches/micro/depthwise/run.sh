#!/usr/bin/env bash
# The depthwise-convolution microbenchmark behind `src/codegen/depthwise.rs` (benches/NOTES.md,
# fourteenth session): five kernel forms at ConvNeXt-T's and EfficientNet's shapes, CUDA events
# over 20 back-to-back launches (a launch floor of a few µs), rel-L2 against f64 on a sample of
# outputs. Run on the GPU machine: bash benches/micro/depthwise/run.sh
set -e
cd "$(dirname "$0")"
nvcc -O3 -arch=sm_90 -std=c++17 dw.cu -o /tmp/fusec-dw
/tmp/fusec-dw
