#!/usr/bin/env bash
# On the GPU machine (from the repository root, after scripts/gpu-stage.sh here): the GPU
# test suite and a `fusec run --check` from the README. Results go to $OUT (or ./gpu-out).
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
gunzip -kf .gpu/*.gz
export FUSEC_MODELS_DIR="$PWD/models" FUSEC_GPU_RESULTS="$out/gpu_results.md" RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
.gpu/test-gpu --test-threads 1 --nocapture 2>&1 | tee "$out/test-gpu.log"
python3 - <<'PY'
import numpy as np
np.save("/tmp/ids.npy", np.random.default_rng(0).integers(1, 512, size=(2, 16)).astype(np.int64))
np.save("/tmp/x.npy", np.random.default_rng(1).standard_normal((3, 7, 40)).astype(np.float32))
PY
{
  .gpu/fusec compile models/bert_ts.onnx -o /tmp/bert.bundle --dim batch=2 --dim seq=16 &&
  .gpu/fusec run /tmp/bert.bundle --input input=/tmp/ids.npy --check &&
  .gpu/fusec run models/mlp_block.onnx --input x=/tmp/x.npy --check --output-dir /tmp/out
} 2>&1 | tee "$out/cli.log"
