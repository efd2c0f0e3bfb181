#!/usr/bin/env bash
# Coverage-guided fuzzing of what fusec reads from files (needs the nightly toolchain and
# cargo-fuzz: `rustup toolchain install nightly && cargo install cargo-fuzz`):
#   onnx_import   ONNX model bytes → import, then the whole compile of what imports
#   bundle_load   bundle bytes → Bundle::from_bytes; the bytes as a header with right lengths
#                 and checksum → load, the session's checks, save
#   tensor_file   bytes as .npy and as an ONNX TensorProto → tensor_io::read_tensor
# Seeds: the fixtures in models/, the ONNX node cases (scripts/onnx_node_cases.py, in
# .onnx-node-cases/) and bundles compiled from small fixtures.
#
#   scripts/fuzz.sh SECONDS [TARGET...]      # each target for SECONDS (default: all three)
#
# A crash leaves its input in fuzz/artifacts/TARGET/; keep it as a regression test in
# tests/errors.rs or tests/bundle.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:?seconds per target}"
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(onnx_import bundle_load tensor_file)
corpus=fuzz/corpus
mkdir -p "$corpus/onnx_import" "$corpus/bundle_load" "$corpus/tensor_file"
if [ -z "$(ls -A "$corpus/onnx_import")" ]; then
    find models -name '*.onnx' -size -100k -exec cp {} "$corpus/onnx_import/" \;
    for d in .onnx-node-cases/*/; do
        n=$(basename "$d")
        [ -f "$d/model.onnx" ] && cp "$d/model.onnx" "$corpus/onnx_import/$n.onnx"
        for f in "$d"/test_data_set_0/*.pb; do [ -f "$f" ] && cp "$f" "$corpus/tensor_file/$n-$(basename "$f")"; done
    done
    cargo build --release --bin fusec
    for m in mlp_block gelu_op layernorm_div attention_gqa_d80; do
        target/release/fusec compile "models/$m.onnx" -o "$corpus/bundle_load/$m.bundle" --dim batch=2 || true
    done
    # The headers alone too: bundle_load also reads its input as a header (see the target).
    python3 - "$corpus/bundle_load" <<'PY'
import glob, struct, sys
for f in glob.glob(sys.argv[1] + "/*.bundle"):
    b = open(f, "rb").read()
    n = struct.unpack("<Q", b[12:20])[0]
    open(f + ".json", "wb").write(b[20:20 + n])
PY
    python3 - "$corpus/tensor_file" <<'PY'
import sys, numpy as np
d = sys.argv[1]
for i, (shape, dtype) in enumerate([((2, 3), "<f4"), ((4,), "<i8"), ((1, 2, 2), "<f2"), ((3,), "|b1"), ((), "<f8")]):
    np.save(f"{d}/seed{i}.npy", np.arange(int(np.prod(shape))).reshape(shape).astype(dtype))
PY
fi
for t in "${targets[@]}"; do
    echo "=== $t: $seconds s"
    cargo +nightly fuzz run -O "$t" "$corpus/$t" -- -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 -max_len=1048576 2>&1 \
        | grep -E "^#[0-9]+\s+(DONE|INITED)|^Done |ERROR|SUMMARY|Test unit written|crash-|timeout-|oom-|stat::" || true
done
