#!/usr/bin/env bash
# Stages what the GPU machine needs into .gpu/ (ignored by git): the release fusec binary and
# the GPU test binary, compressed. The GPU machine has no cargo; run scripts/gpu-run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins --examples
cargo test --release --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' > /tmp/fusec-test-binaries
rm -rf .gpu && mkdir -p .gpu
cp target/release/fusec .gpu/
cp target/release/examples/api .gpu/example-api
cp target/release/examples/soak .gpu/soak
# Test binaries staged: gpu by default; FUSEC_STAGE_TESTS="gpu generate attention_tiles ..."
# names others (each runs its GPU half there: part `gputests` of scripts/gpu-call.sh).
wanted=" ${FUSEC_STAGE_TESTS:-gpu} "
while read -r name path; do
    case "$wanted" in *" $name "*) cp "$path" ".gpu/test-$name" ;; esac
done < /tmp/fusec-test-binaries
strip .gpu/* 2>/dev/null || true
gzip -9 .gpu/*   # what travels is capped at 64 MiB
# FUSEC_STAGE_WHEEL=1: the Python wheel too (part `python` of scripts/gpu-call.sh installs it).
if [ "${FUSEC_STAGE_WHEEL:-0}" = 1 ]; then
    (cd python && ../.venv/bin/maturin build --release --locked --quiet -o ../.gpu/whl)
fi
# The commit the binaries come from (with -dirty for uncommitted changes), for benches/report.py.
git describe --always --dirty --abbrev=7 > .gpu/commit.txt
du -sh .gpu
