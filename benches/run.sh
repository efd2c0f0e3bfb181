#!/usr/bin/env bash
# The benchmark suite, on a machine with an NVIDIA GPU, torch and transformers:
#
#     benches/run.sh                 # everything: export, fusec, PyTorch, report
#     benches/run.sh export fusec    # only some parts, in this order
#
# Parts: export (benches/export.py → $WORK), fusec (`fusec bench --json` for every model,
# shape and precision, and the pointwise chains), torch (benches/compare_torch.py), report
# (benches/report.py → benches/RESULTS.md and benches/latency.svg from $RESULTS/*.json).
# FUSEC (default: target/release/fusec, else .gpu/fusec), WORK (exported models, default
# .bench-work, ignored by git), RESULTS (default benches/results), ITERS (default 100) override.
# TORCH_ARGS passes options to compare_torch.py (default "--dtypes fp16,fp32 --compile-shapes
# 8x128": the default-mode torch.compile, never the fastest PyTorch mode, only at 8x128);
# FUSEC_MODELS (default "bert_base gpt2_small llama_style"), SHAPES (default "1x128 8x128
# 32x128"), PRECISIONS (default "fp32 fp16") and FUSEC_MICRO=0 narrow the fusec part;
# EXPORT_MODELS the export part.
set -euo pipefail
cd "$(dirname "$0")/.."
FUSEC="${FUSEC:-$( [ -x target/release/fusec ] && echo target/release/fusec || echo .gpu/fusec )}"
WORK="${WORK:-.bench-work}"
RESULTS="${RESULTS:-benches/results}"
ITERS="${ITERS:-100}"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(export fusec torch report)
mkdir -p "$WORK" "$RESULTS"

for part in "${parts[@]}"; do
  case "$part" in
    export)
      python3 benches/export.py "$WORK"
      ;;
    fusec)
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$RESULTS/gpu.txt"
      "$FUSEC" --version > "$RESULTS/fusec-version.txt" 2>&1 || true
      # The commit the binary was built from (scripts/gpu-stage.sh records it), for the report.
      commit="$(dirname "$FUSEC")/commit.txt"
      if [ -f "$commit" ]; then cp "$commit" "$RESULTS/fusec-commit.txt"; else rm -f "$RESULTS/fusec-commit.txt"; fi
      for model in ${FUSEC_MODELS:-bert_base gpt2_small llama_style}; do
        for shape in ${SHAPES:-1x128 8x128 32x128}; do
          for precision in ${PRECISIONS:-fp32 fp16}; do
            b="${shape%x*}" s="${shape#*x}"
            profile=()
            [ "$shape" = 8x128 ] && profile=(--profile)
            echo "== fusec bench $model $shape $precision ($(date -u +%T))"
            "$FUSEC" bench "$WORK/$model.onnx" --dim batch="$b" --dim seq="$s" --precision "$precision" \
              --iters "$ITERS" "${profile[@]}" --json "$RESULTS/fusec-$model-$shape-$precision.json" \
              || echo "FAILED: fusec bench $model $shape $precision (exit $?)"
          done
        done
      done
      [ "${FUSEC_MICRO:-1}" = 0 ] && continue
      for chain in bias_gelu bias_dropout_residual_layernorm; do
        for shape in 4096x3072 8192x4096; do
          echo "== fusec bench ${chain}_$shape ($(date -u +%T))"
          "$FUSEC" bench "$WORK/${chain}_$shape.onnx" --iters "$ITERS" --profile \
            --json "$RESULTS/fusec-${chain}-$shape-fp32.json" || echo "FAILED: fusec bench ${chain}_$shape (exit $?)"
        done
      done
      ;;
    torch)
      # shellcheck disable=SC2086
      python3 benches/compare_torch.py --iters "$ITERS" --json "$RESULTS/torch-$(date +%s).json" \
        ${TORCH_ARGS:---dtypes fp16,fp32 --compile-shapes 8x128}
      ;;
    report)
      python3 benches/report.py "$RESULTS" benches/RESULTS.md benches/latency.svg
      ;;
    *)
      echo "unknown part '$part' (export, fusec, torch, report)" >&2
      exit 2
      ;;
  esac
done
