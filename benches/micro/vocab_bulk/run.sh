#!/usr/bin/env bash
# The vocabulary's projection through bulk copies (benches/NOTES.md, fiftieth session): GPT-2
# small's 50,257 × 768 tied embedding at 32, 8 and 1 rows, W streamed through shared-memory
# stages, against a read of W alone and a plain reference. Run on the GPU machine:
#   bash benches/micro/vocab_bulk/run.sh
set -e
cd "$(dirname "$0")"
for rows in 32 8 1; do
  nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -DROWS=$rows vocab.cu -o /tmp/fusec-vocab-bulk-$rows
  /tmp/fusec-vocab-bulk-$rows
done
