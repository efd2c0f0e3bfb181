#!/usr/bin/env bash
# On the GPU machine (from the repository root, after scripts/gpu-stage.sh here): the GPU
# test suite and a `fusec run --check` from the README. Results go to $OUT (or ./gpu-out).
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
gunzip -kf .gpu/*.gz
python3 scripts/onnx_node_cases.py /tmp/fusec-node-cases > "$out/node-cases.txt" 2>&1
export FUSEC_MODELS_DIR="$PWD/models" FUSEC_GPU_RESULTS="$out/gpu_results.md" RUST_BACKTRACE=1
export FUSEC_ONNX_NODE_CASES=/tmp/fusec-node-cases FUSEC_GPU_NODE_RESULTS="$out/node_results.md"
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
  .gpu/fusec run models/mlp_block.onnx --input x=/tmp/x.npy --check --output-dir /tmp/out &&
  .gpu/fusec run /tmp/fusec-node-cases/test_softmax_axis_1 &&
  .gpu/fusec run /tmp/fusec-node-cases/test_layer_normalization_4d_axis_negative_1 &&
  .gpu/fusec run models/bert_ts.onnx --input input=/tmp/ids.npy --check --no-cuda-graph
} 2>&1 | tee "$out/cli.log"
{
  .gpu/fusec bench models/bert12_ts.onnx --dim batch=8 --dim seq=64 --json "$out/bench_bert12.json"
  .gpu/fusec bench models/gpt2_ts.onnx --dim batch=8 --dim seq=64
  .gpu/fusec bench models/bert12_ts.onnx --dim batch=8 --dim seq=64 --precision fp16
  .gpu/fusec bench models/bert12_ts.onnx --dim batch=8 --dim seq=64 --precision bf16
} 2>&1 | tee "$out/bench.log"
# The pointwise chains of the benchmark suite (benches/export.py writes them; no model
# download), fused against unfused.
{
  EXPORT_MODELS="" python3 benches/export.py /tmp/fusec-chains &&
  for chain in bias_gelu bias_dropout_residual_layernorm; do
    for shape in 4096x3072 8192x4096; do
      .gpu/fusec bench "/tmp/fusec-chains/${chain}_$shape.onnx" --profile
    done
  done
} 2>&1 | tee "$out/chains.log"
