#!/usr/bin/env bash
# The decoding chain microbenchmark (benches/NOTES.md, twenty-seventh session): a batch-1 step's
# 73 dependent matrix-vector products as kernels with and without programmatic dependent
# launch, and as one persistent kernel with grid barriers; then the same chain with 98 KB a
# phase. Run on the GPU machine: bash benches/micro/decode_chain/run.sh
set -e
cd "$(dirname "$0")"
nvcc -O3 -arch=sm_90a -std=c++17 chain.cu -o /tmp/fusec-decode-chain
/tmp/fusec-decode-chain
TINY=1 /tmp/fusec-decode-chain
TWO=1 /tmp/fusec-decode-chain
# The weights staged in shared memory before the wait, with each phase's timeline (staged.cu).
nvcc -O3 -arch=sm_90a -std=c++17 staged.cu -o /tmp/fusec-decode-staged
/tmp/fusec-decode-staged
TWO=1 /tmp/fusec-decode-staged
TINY=1 /tmp/fusec-decode-staged
