#!/usr/bin/env bash
# One device call's worth of GPU work, run on the GPU machine from the repository root after
# scripts/gpu-stage.sh staged .gpu/ (carry it). Parts, in the order given:
#   tests     the GPU test suite on every fixture
#   compile   fusec compile -v of bert_base fp16 (cold NVRTC cache, then cached) and fp32
#   ranges    bert_base fp16 for batch=1..32 x seq=1..512: compile times against a static
#             bundle, then bench --sizes $SHAPES against bundles for each shape alone
#   mask      the masked exports (bert_base_mask, gpt2_small_mask) in fp16 at $MASK_SHAPES
#             (default 8x128 32x512): .gpu/fusec-old (staged by hand) against .gpu/fusec, each
#             fused against unfused with a profile; then one bert_base_mask bundle for
#             batch=1..32 x seq=1..512 at $SHAPES beside bundles for each shape alone
#   variants  bert_base 8x128 fp16 profiles with FUSEC_ATTENTION_WARPS=1, 2 and 4
#   suite     benches/run.sh fusec + torch for $FUSEC_MODELS (fp16), side by side
#   micro     the pointwise chains (f32): fusec and torch, side by side
#   vocabbulk the vocabulary's projection with W streamed through shared memory by bulk copies
#             (benches/micro/vocab_bulk, nvcc there) at 32, 8 and 1 rows, against W read alone
#   ab        .gpu/fusec-old (an earlier build, staged by hand) against .gpu/fusec: compile -v
#             of bert_base fp16 cold and cached, then 8x128 fp16 profiles of $FUSEC_MODELS
#   fp32      the suite's fp32 rows at $SHAPES (default 1x128 32x128): fusec and torch
#   usability what the README shows a new user: --version, the API example (examples/api.rs,
#             staged as .gpu/example-api), compile --json, bench --json -, run DIR on the ONNX
#             node cases carried in .onnx-node-cases/
#   gemms     8x128 and 1x128 fp16 of $FUSEC_MODELS with the GEMM variants off
#             (FUSEC_GEMM_VARIANTS=0) and on, each from a cold algorithm cache; every candidate's
#             program time logged (RUST_LOG=fusec=debug) into $OUT/res/gemms-*.log
#   attn      8x128 and 32x128 fp16 profiles of $FUSEC_MODELS with FUSEC_ATTENTION_SPLITS=1, 2
#             and 4, then the fixture test with 2 and 4
#   pdl       1x128, 8x128 and 32x128 fp16 profiles of $FUSEC_MODELS with programmatic dependent
#             launch off (FUSEC_PDL=0) and on, one GEMM cache shared; 1x128 with
#             FUSEC_ATTENTION_SPLITS=2 and 4; then the GPU tests with it on
#   readme    the README's commands as a new user types them, `fusec` being .gpu/fusec on PATH
#             (compile of the set-up, the token ids, run --check, inspect --fused and --svg,
#             bench, --version, cache info, the API example)
#   threads   side-by-side GPU test runs (the node cases beside the other tests) cut off after
#             $SECS seconds (default 12), $TRIES times (default 16): exit codes, crash reports
#             (tests/crash) into $OUT/res/crash-N.log; then examples/soak.rs on the tiny BERT
#             fixture: 8 threads x 1,000 runs, 100,000 runs of one session, two sessions of one
#             bundle, 8 threads making and dropping 50 sessions each, out of memory
#   sanitizer compute-sanitizer memcheck, racecheck, initcheck and synccheck over soak's two
#             sessions (2 runs each; memcheck, racecheck, initcheck in fp16 as well), then
#             memcheck over the GPU test suite (cut off after $SANITIZE_SECS, default 300)
#   racecheck compute-sanitizer racecheck over the GPU tests: every fixture on its own, then
#             each other test ($RACE_SECS each, default 90)
#   cnn       torchvision classifiers (benches/export_cnn.py, TorchScript exporter, random
#             weights) as a new user brings them: inspect, run --check against tract at batch 1
#             (fp32), then bench --strict fused against unfused at batch 8 (fp32 and fp16);
#             then PyTorch eager and reduce-overhead (channels-last, fp16, batch 8) side by side
#             (benches/compare_torch_cnn.py; CNN_TORCH= leaves it out)
#   cnnsuite  #26's table in one call: the torchvision classifiers and ViT-B/16
#             (benches/export_cnn.py), in $PRECISION (fp16 or fp32, default fp16), for each
#             batch of $BATCHES (default "8 1 32") fusec
#             bench --strict of every model, then PyTorch eager and reduce-overhead
#             (benches/compare_torch_cnn.py, channels-last); no step started after $STOP seconds
#             from the part's start (default 500)
#   strict    fused against unfused over every suite model, no PyTorch: bench --strict (fp16,
#             or $PRECISION) of the transformers at $BATCHES (default "1 8 32") x 128 and of the
#             cnnsuite models at $BATCHES; exit 0 on each means the outputs agreed and the
#             fused build was not slower; no step started after $STOP seconds (default 520)
#   prefill   #27's prefill bound: GPT-2 small's prompt step as generate compiles it (128
#             tokens after one cached position, the cache in place) against the same decoder
#             exported without a cache (export_cache.py --forward), at batch 1 and 8, twice
#   inprogram GPT-2 small's one-token step at 257 keys (bench --cache-in-place, fp16) at $BATCHES
#             (default "32 1") for each setting of $SETTINGS (as decodeab): bench --profile
#             --in-program, each step's share of the program where it runs among the others beside
#             its time repeated alone, summed by kind of step (digits in the name dropped); JSON
#             into $OUT/res/inprogram-bB-SETTING.json
#   tuneab    GPT-2 small's one-token step at 385 keys (bench --cache-in-place, fp16) at
#             $BATCHES (default 32 8) for each setting of $SETTINGS (as decodeab), each load from a
#             fresh cache directory, $ROUNDS times (default 1): the fused median, the load's GEMM
#             choices and its programmatic-launch line (the load's tuning, e.g. FUSEC_TUNE_SWEEPS)
#   cnncheck  each model of cnnsuite against tract at batch 1 (fusec run --check, x_1.npy) in
#             $PRECISION (default fp32; the tolerance follows it)
#   gputests  every staged test binary but test-gpu (FUSEC_STAGE_TESTS in scripts/gpu-stage.sh):
#             their GPU halves (tests/generate.rs, tests/attention_tiles.rs, ...); the CLI tests
#             run the staged release fusec (FUSEC_TEST_BIN)
#   python    the staged wheel (FUSEC_STAGE_WHEEL=1) installed, then python/tests run from
#             outside the checkout (so that `import fusec` is the wheel, not python/fusec/)
#   decode    GPT-2 small with its cache (models/export_cache.py --size small): fusec generate,
#             fp16, a 128-token prompt and 256 new tokens at batch 1, 8 and 32, greedy, then
#             top-p 0.9 at batch 1; each sequence's tokens hashed, so builds can be compared
#   decodeab  knob settings side by side in decoding: for each of $ROUNDS rounds (default 2),
#             each batch of $BATCHES (default "1 8 32"), each decoder of $DECODERS (default
#             "gpt2 llama", export_cache.py --size small) and each setting of $SETTINGS (default
#             "-": the defaults; a setting is VAR=value pairs joined by commas, each setting
#             compiling into a cache directory of its own), fusec generate fp16 128 + 256
#             tokens greedy: its ms a token and a hash of its tokens, one line each
#   choices   the one-token step's GEMM choices (fusec generate -v) of each decoder of $DECODERS
#             at each batch of $BATCHES, into $OUT/choices.txt: which products run on fusec's
#             kernel for a few rows and which on cuBLAS(Lt)
#   ncuattn   ncu of GPT-2 small's decoding attention inside fusec generate at batch $BATCH
#             (default 32), one kernel (a step's first layer, about the hundredth step), for
#             each setting of $SETTINGS (as decodeab): generate is run once first into the
#             setting's cache directory, so that the load's timing of its GEMM choices (which
#             replays the prompt program, its attention kernels counted by --launch-skip) is
#             cached when ncu runs; the report into $OUT/ncu-SETTING.txt, its headline lines shown
#   gate      the Llama-style decoder (models/export_cache.py --size small llama): fusec generate
#             fp16 128 + 256 tokens at batch 1, FUSEC_SKINNY_GATE=1 and 0 alternated twice,
#             the few-row kernels pinned (FUSEC_SKINNY=1), then once each chosen by timing;
#             and the staged test-skinny_gate (its GPU half against tract)
#   siblings  the Llama-style decoder and GPT-2 small (export_cache.py --size small): fusec
#             generate fp16 128 + 256 tokens at batch 1 with FUSEC_MERGE_SIBLINGS=0, the
#             default and FUSEC_REPEATS_AS_TILES=1, alternated twice; then the staged
#             test-siblings (which sets the knob itself where it needs it), and the ONNX
#             node cases' Tile cases with it (scripts/onnx_node_cases.py; test-gpu staged)
#   vocab     the Llama-style decoder (export_cache.py --size small llama): fusec generate fp16
#             128 + 256 tokens at batch 1 with FUSEC_SKINNY_TWO_BLOCKS=0 and the default
#             alternated twice, each from a cold cache (FUSEC_CACHE_DIR, so the load's choice
#             between cuBLAS and fusec's kernel for the vocabulary is made again), then `bench
#             --profile` of the step both ways: which one the projection runs on, and its µs
#   gencheck  fusec generate --check: each decoder fixture of models/ in fp32, fp16 and bf16
#             (two prompts, $FIX_TOKENS new tokens, default 24), then each decoder of $DECODERS
#             (default "gpt2 llama", export_cache.py --size small) in each precision of
#             $PRECISIONS (default "fp32 fp16 bf16"): two prompts of 128 and 97 tokens and
#             $NEW_TOKENS new ones (default 64); each run's check lines and its exit status
#   stepcheck one decoding step of each decoder of $DECODERS (default "gpt2 llama",
#             export_cache.py --size small) at $BATCH sequences (default 32) after $PAST cached
#             positions (default 256), each sequence at a length of its own
#             (scripts/step_check.py): compiled fp16 with the cache in place for each setting of
#             $SETTINGS (as decodeab), then fusec run --check against tract
#   all       the whole suite in one call (export, fusec, torch eager / compile /
#             reduce-overhead, report into $OUT/res), every step cut off by one deadline
#             ($BUDGET seconds from the start of the part, default 570) so the results and the
#             timestamps of what ran come back
# Logs and results go to $OUT (log.txt, res.tgz).
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/res"
for f in .gpu/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .gpu/*
[ -e .gpu/fusec-old ] && chmod +x .gpu/fusec-old
export PYTHONUNBUFFERED=1 FUSEC_CACHE_DIR="${FUSEC_CACHE_DIR:-/tmp/fusec-cache}"
models="${FUSEC_MODELS:-bert_base gpt2_small}"
# The decoders' 128-token prompt (`gpt2`, or any other name: the Llama-style decoder's ids).
prompt_ids() {
  case "$1" in
    gpt2) python3 -c "print(','.join(str((i * 7919 + 13) % 50257) for i in range(128)))" ;;
    *) python3 -c "print(','.join(str((i * 7919) % 31000 + 11) for i in range(128)))" ;;
  esac
}
# The decoder `$1` (gpt2 or llama) exported with its cache (export_cache.py --size small) into
# .bench-work, unless it is there.
export_cache() {
  [ -f ".bench-work/$1_small_cache.onnx" ] || timeout 300 python3 models/export_cache.py .bench-work --size small "$1" 2>&1 | tail -1
}
export_models() {
  local need=""
  for m in "$@"; do [ -f ".bench-work/$m.onnx" ] || need="$need $m"; done
  [ -z "$need" ] || EXPORT_MODELS="${need# }" timeout 300 python3 benches/export.py .bench-work 2>&1 | tail -2
}
{
for part in "$@"; do
  echo "=== $part ($(date -u +%H:%M:%S))"
  case "$part" in
    tests)
      # The fixtures and the node cases where this checkout has them, wherever the tests were built.
      [ -d /tmp/fusec-node-cases ] || python3 scripts/onnx_node_cases.py /tmp/fusec-node-cases | tail -1
      FUSEC_MODELS_DIR="$PWD/models" FUSEC_ONNX_NODE_CASES=/tmp/fusec-node-cases FUSEC_GPU_RESULTS="$OUT/res/gpu_results.md" \
        FUSEC_GPU_NODE_RESULTS="$OUT/res/node_results.md" timeout 420 .gpu/test-gpu --nocapture 2>&1 | grep -E "^test |test result|FAIL|panicked|skipped|node cases" ;;
    gputests)
      for t in .gpu/test-*; do
        [ "$t" = .gpu/test-gpu ] && continue
        echo "--- $t"
        FUSEC_MODELS_DIR="$PWD/models" FUSEC_TEST_BIN="$PWD/.gpu/fusec" timeout 300 "$t" --nocapture 2>&1 | grep -E "^test |test result|panicked|rel-L2"
      done ;;
    python)
      python3 -m pip install --no-deps --no-index -q .gpu/whl/*.whl
      root=$PWD
      (cd /tmp && FUSEC_MODELS_DIR="$root/models" timeout 400 python3 -m pytest -q -p no:cacheprovider "$root/python/tests" 2>&1 | tail -15) ;;
    decode)
      export_cache gpt2
      prompt=$(prompt_ids gpt2)
      for args in "--batch 1" "--batch 8" "--batch 32" "--batch 1 --sample top-p=0.9 --seed 1"; do
        .gpu/fusec generate .bench-work/gpt2_small_cache.onnx --prompt-ids "$prompt" --max-new-tokens 256 --precision fp16 $args > /tmp/decode.txt 2>&1
        echo "--- $args: tokens $(grep '^sequence' /tmp/decode.txt | md5sum | cut -c1-8)"
        grep -E "time to first|error" /tmp/decode.txt
      done ;;
    decodeab)
      for m in ${DECODERS:-gpt2 llama}; do
        export_cache $m
      done
      for round in $(seq 1 "${ROUNDS:-2}"); do
        for b in ${BATCHES:-1 8 32}; do
          for m in ${DECODERS:-gpt2 llama}; do
            ids=$(prompt_ids $m)
            for setting in ${SETTINGS:--}; do
              vars=(); [ "$setting" = - ] || IFS=, read -ra vars <<< "$setting"
              env "${vars[@]}" FUSEC_CACHE_DIR="/tmp/decodeab-${setting//[^A-Za-z0-9]/_}" timeout 90 \
                .gpu/fusec generate .bench-work/${m}_small_cache.onnx --prompt-ids "$ids" --max-new-tokens 256 \
                --precision fp16 --batch $b > /tmp/decodeab.txt 2>&1
              echo "round $round $m b$b $setting: $(grep -E 'time to first' /tmp/decodeab.txt | sed 's/.*token steps), //') tokens $(grep '^sequence' /tmp/decodeab.txt | md5sum | cut -c1-8) $(grep -i error /tmp/decodeab.txt | head -1)"
            done
          done
        done
      done ;;
    gencheck)
      for m in gpt2_cache_ts llama_cache_ts gpt2_cache_dynamo llama_cache_dynamo; do
        for p in fp32 fp16 bf16; do
          echo "--- $m $p"
          timeout 120 .gpu/fusec generate "models/$m.onnx" --prompt-ids 5,77,300 --prompt-ids 11,2,480,9 \
            --max-new-tokens "${FIX_TOKENS:-24}" --precision "$p" --check 2>&1 | grep -E "check|error|Error"
          echo "exit ${PIPESTATUS[0]}"
        done
      done
      for d in ${DECODERS:-gpt2 llama}; do
        export_cache "$d"
        long=$(prompt_ids "$d"); short=$(echo "$long" | cut -d, -f1-97)
        for p in ${PRECISIONS:-fp32 fp16 bf16}; do
          echo "--- $d small $p"
          start=$(date +%s)
          timeout 240 .gpu/fusec generate ".bench-work/${d}_small_cache.onnx" --prompt-ids "$long" --prompt-ids "$short" \
            --max-new-tokens "${NEW_TOKENS:-64}" --precision "$p" --check 2>&1 | grep -E "check|error|Error|ms per token"
          echo "exit ${PIPESTATUS[0]} ($(( $(date +%s) - start )) s)"
        done
      done ;;
    stepcheck)
      for m in ${DECODERS:-gpt2 llama}; do
        export_cache $m
        python3 scripts/step_check.py .bench-work/${m}_small_cache.onnx /tmp/stepcheck-$m "${BATCH:-32}" "${PAST:-256}" \
          > /tmp/stepcheck-$m.txt || continue
        for setting in ${SETTINGS:--}; do
          vars=(); [ "$setting" = - ] || IFS=, read -ra vars <<< "$setting"
          echo "--- $m $setting"
          env "${vars[@]}" timeout 150 .gpu/fusec compile .bench-work/${m}_small_cache.onnx -o /tmp/stepcheck.bundle \
            $(sed -n 1p /tmp/stepcheck-$m.txt) --precision fp16 --cache-in-place -q 2>&1 | tail -1
          timeout 150 .gpu/fusec run /tmp/stepcheck.bundle $(sed -n 2p /tmp/stepcheck-$m.txt) --check 2>&1 \
            | grep -iE "check|error|differ"
        done
      done ;;
    choices)
      for m in ${DECODERS:-gpt2 llama}; do
        export_cache $m
        for b in ${BATCHES:-1 8 32}; do
          echo "--- $m b$b"
          timeout 90 .gpu/fusec -v generate .bench-work/${m}_small_cache.onnx --prompt-ids "$(prompt_ids $m)" \
            --max-new-tokens 64 --precision fp16 --batch $b 2>&1 | grep -E '^one-token step:   |error'
        done
      done | tee -a "$OUT/choices.txt" ;;
    ncuattn)
      export_cache gpt2
      ids=$(prompt_ids gpt2)
      for setting in ${SETTINGS:--}; do
        vars=(); [ "$setting" = - ] || IFS=, read -ra vars <<< "$setting"
        tag=${setting//[^A-Za-z0-9]/_}
        run=(.gpu/fusec generate .bench-work/gpt2_small_cache.onnx --prompt-ids "$ids" --max-new-tokens 128
          --precision fp16 --batch "${BATCH:-32}")
        env "${vars[@]}" FUSEC_CACHE_DIR="/tmp/ncuattn-$tag" timeout 90 "${run[@]}" 2>&1 | grep -E "time to first|error"
        # 12 attention launches a step, the prompt's among them: the first layer of a step about
        # the hundredth (1212 is what the thirty-seventh session's warm-cache run skipped).
        env "${vars[@]}" FUSEC_CACHE_DIR="/tmp/ncuattn-$tag" timeout 200 /usr/local/cuda/bin/ncu \
          --kernel-name regex:attention --launch-skip 1212 --launch-count 1 --clock-control none \
          --cache-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats "${run[@]}" \
          > "$OUT/ncu-$tag.txt" 2>&1
        echo "--- $setting"
        grep -E "^  fusec_|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Eligible Warps|Issued Warp" "$OUT/ncu-$tag.txt"
      done ;;
    gate)
      export_cache llama
      prompt=$(prompt_ids llama)
      for run in "1 1" "0 1" "1 1" "0 1" "1 " "0 "; do
        set -- $run
        FUSEC_SKINNY_GATE=$1 FUSEC_SKINNY=${2:-} .gpu/fusec generate .bench-work/llama_small_cache.onnx --prompt-ids "$prompt" \
          --max-new-tokens 256 --precision fp16 --batch 1 > /tmp/gate.txt 2>&1
        echo "--- FUSEC_SKINNY_GATE=$1 FUSEC_SKINNY=${2:-timed}: tokens $(grep '^sequence' /tmp/gate.txt | md5sum | cut -c1-8)"
        grep -E "time to first|error" /tmp/gate.txt
      done
      [ -x .gpu/test-skinny_gate ] && FUSEC_MODELS_DIR="$PWD/models" timeout 120 .gpu/test-skinny_gate 2>&1 | grep -E "^test |test result|panicked" ;;
    siblings)
      for m in gpt2 llama; do
        export_cache $m
      done
      llama=$(prompt_ids llama)
      gpt2=$(prompt_ids gpt2)
      for run in 1 2; do
        for knobs in "FUSEC_MERGE_SIBLINGS=0" "FUSEC_MERGE_SIBLINGS=1" "FUSEC_REPEATS_AS_TILES=1"; do
          for m in llama gpt2; do
            ids=$llama; [ $m = gpt2 ] && ids=$gpt2
            env $knobs .gpu/fusec generate .bench-work/${m}_small_cache.onnx --prompt-ids "$ids" \
              --max-new-tokens 256 --precision fp16 --batch 1 > /tmp/sib.txt 2>&1
            echo "--- $knobs $m: tokens $(grep '^sequence' /tmp/sib.txt | md5sum | cut -c1-8) $(grep -oE '[0-9.]+ ms per token|error.*' /tmp/sib.txt)"
          done
        done
      done
      [ -x .gpu/test-siblings ] && FUSEC_MODELS_DIR="$PWD/models" timeout 120 .gpu/test-siblings 2>&1 | grep -E "^test |test result|panicked"
      if [ -x .gpu/test-gpu ]; then
        [ -d /tmp/fusec-node-cases ] || timeout 120 python3 scripts/onnx_node_cases.py /tmp/fusec-node-cases | tail -1
        FUSEC_REPEATS_AS_TILES=1 FUSEC_ONNX_NODE_CASES=/tmp/fusec-node-cases FUSEC_GPU_NODE_RESULTS="$OUT/res/node_results.md" \
          timeout 200 .gpu/test-gpu onnx_node_cases 2>&1 | grep -E "^test |test result|panicked"
        grep -iE "tile" "$OUT/res/node_results.md" | head -20
      fi ;;
    vocab)
      export_cache llama
      prompt=$(prompt_ids llama)
      for run in 1 2; do
        for two in 0 1; do
          rm -rf /tmp/vocab-cache
          FUSEC_CACHE_DIR=/tmp/vocab-cache FUSEC_SKINNY_TWO_BLOCKS=$two .gpu/fusec generate .bench-work/llama_small_cache.onnx \
            --prompt-ids "$prompt" --max-new-tokens 256 --precision fp16 --batch 1 > /tmp/vocab.txt 2>&1
          echo "--- FUSEC_SKINNY_TWO_BLOCKS=$two: tokens $(grep '^sequence' /tmp/vocab.txt | md5sum | cut -c1-8) $(grep -oE '[0-9.]+ ms per token|error.*' /tmp/vocab.txt)"
        done
      done
      for two in 0 1; do
        rm -rf /tmp/vocab-cache
        FUSEC_CACHE_DIR=/tmp/vocab-cache FUSEC_SKINNY_TWO_BLOCKS=$two timeout 120 .gpu/fusec bench .bench-work/llama_small_cache.onnx \
          --dim batch=1 --dim seq=1 --dim past=384 --dim total=385 --precision fp16 --cache-in-place --profile 2>&1 | grep -E "^fused|x32000"
      done ;;
    compile)
      export_models bert_base
      ls -l .bench-work/bert_base.onnx
      rm -rf /tmp/cold && FUSEC_CACHE_DIR=/tmp/cold .gpu/fusec compile .bench-work/bert_base.onnx -o /tmp/b.bundle --dim batch=8 --dim seq=128 --precision fp16 -v
      for i in 1 2; do FUSEC_CACHE_DIR=/tmp/cold .gpu/fusec compile .bench-work/bert_base.onnx -o /tmp/b.bundle --dim batch=8 --dim seq=128 --precision fp16 -v; done
      FUSEC_CACHE_DIR=/tmp/cold .gpu/fusec compile .bench-work/bert_base.onnx -o /tmp/b32.bundle --dim batch=8 --dim seq=128 -v
      FUSEC_CACHE_DIR=/tmp/cold .gpu/fusec compile .bench-work/bert_base.onnx -o /tmp/b32.bundle --dim batch=8 --dim seq=128 -v
      ;;
    ranges)
      # One BERT-base fp16 bundle for batch 1..32 x seq 1..512 against static bundles: compile
      # times (cold NVRTC cache, then cached; wall clock), then latency at $SHAPES (default
      # 1x128,8x128,32x128,8x384) beside a bundle compiled for each shape alone.
      export_models bert_base
      B=.bench-work/bert_base.onnx
      for cache in cold warm; do
        [ $cache = cold ] && rm -rf /tmp/rcold
        for dims in "batch=8 seq=128" "batch=32 seq=512" "batch=1..32 seq=1..512"; do
          set -- $dims
          s=$(date +%s%N); FUSEC_CACHE_DIR=/tmp/rcold .gpu/fusec compile $B -o /tmp/r.bundle --dim $1 --dim $2 --precision fp16 -v 2>&1 | grep -E "^ *[a-z]+: |ranges|differs|error" | tr -s ' ' | tr '\n' ';'
          echo; echo "compile $cache $dims: $(( ($(date +%s%N) - s) / 1000000 )) ms"
        done
      done
      .gpu/fusec bench $B --dim batch=1..32 --dim seq=1..512 --precision fp16 --sizes "${SHAPES:-1x128,8x128,32x128,8x384}" --iters 300 --json "$OUT/res/sizes-bert_base.json"
      ;;
    mask)
      export_models bert_base_mask gpt2_small_mask
      for m in bert_base_mask gpt2_small_mask; do
        for shape in ${MASK_SHAPES:-8x128 32x512}; do
          for build in old new; do
            bin=.gpu/fusec; [ $build = old ] && bin=.gpu/fusec-old
            echo "--- $build: $m $shape fp16"
            FUSEC_CACHE_DIR=/tmp/cache-$build timeout 150 $bin bench .bench-work/$m.onnx --dim batch=${shape%x*} --dim seq=${shape#*x} \
              --precision fp16 --iters 100 --warmup 10 --profile --json "$OUT/res/mask-$build-$m-$shape.json" | grep -E "^fused|^unfused|speedup|attention|pointwise|gather" | head -9
          done
        done
      done
      timeout 200 .gpu/fusec bench .bench-work/bert_base_mask.onnx --dim batch=1..32 --dim seq=1..512 --precision fp16 --sizes "${SHAPES:-1x128,8x128,32x128,8x384}" --iters 200 --json "$OUT/res/sizes-bert_base_mask.json"
      ;;
    cnnsuite)
      C=.bench-work/cnn
      M="resnet50 mobilenet_v3_large efficientnet_b0 convnext_tiny vit_b_16"
      start=$(date +%s)
      left() { echo $(( ${STOP:-500} - ($(date +%s) - start) )); }
      timeout 200 python3 benches/export_cnn.py $C $M 2>&1 | grep -v Warning | tail -3
      for b in ${BATCHES:-8 1 32}; do
        for m in $M; do
          [ "$(left)" -gt 20 ] || { echo "out of time before fusec $m b$b"; continue; }
          echo "--- fusec $m b$b $(date -u +%T)"
          timeout $(( $(left) < 120 ? $(left) : 120 )) .gpu/fusec bench $C/$m.onnx --dim batch=$b --precision "${PRECISION:-fp16}" \
            --iters 30 --warmup 5 --strict --json "$OUT/res/cnnsuite-$m-b$b.json" 2>&1 | grep -E "^fused|^unfused|speedup|warning|error"
          echo "bench --strict exit: ${PIPESTATUS[0]}"
        done
        [ "$(left)" -gt 30 ] || { echo "out of time before torch b$b"; continue; }
        echo "--- torch b$b $(date -u +%T)"
        timeout "$(left)" python3 benches/compare_torch_cnn.py --json "$OUT/res/cnnsuite-torch-b$b.json" \
          --models "$(echo $M | tr ' ' ,)" --batches $b --dtypes "${PRECISION:-fp16}" --iters 30 --warmup 5 2>&1 | grep -E "median_ms|Error"
      done ;;
    strict)
      C=.bench-work/cnn
      M="resnet50 mobilenet_v3_large efficientnet_b0 convnext_tiny vit_b_16"
      start=$(date +%s)
      left() { echo $(( ${STOP:-520} - ($(date +%s) - start) )); }
      export_models bert_base gpt2_small llama_style
      timeout 200 python3 benches/export_cnn.py $C $M 2>&1 | grep -v Warning | tail -1
      strict_one() {  # label file args...
        local label=$1 file=$2; shift 2
        [ "$(left)" -gt 25 ] || { echo "$label: out of time"; return; }
        timeout $(( $(left) < 90 ? $(left) : 90 )) .gpu/fusec bench "$file" "$@" --precision "${PRECISION:-fp16}" \
          --iters 30 --warmup 5 --strict > /tmp/strict.txt 2>&1
        local code=$?  # bench's own exit status (not a pipeline's last command's)
        echo "$label exit $code: $(grep -E "^fused|^unfused|warning|error" /tmp/strict.txt | tr -s ' ' | tr '\n' ';')"
      }
      for b in ${BATCHES:-1 8 32}; do
        for m in bert_base gpt2_small llama_style; do strict_one "$m b$b" .bench-work/$m.onnx --dim batch=$b --dim seq=128; done
        for m in $M; do strict_one "$m b$b" $C/$m.onnx --dim batch=$b; done
      done ;;
    prefill)
      [ -f .bench-work/gpt2_small_forward.onnx ] || timeout 300 python3 models/export_cache.py .bench-work --size small --forward gpt2 2>&1 | tail -1
      for round in 1 2; do
        for b in 1 8; do
          timeout 150 .gpu/fusec bench .bench-work/gpt2_small_cache.onnx --dim batch=$b --dim seq=128 --dim past=1 --dim total=129 \
            --precision fp16 --iters 100 --cache-in-place 2>&1 | grep -E "^fused|error" | sed "s/^/round $round prompt step b$b: /"
          timeout 150 .gpu/fusec bench .bench-work/gpt2_small_forward.onnx --dim batch=$b --dim seq=128 \
            --precision fp16 --iters 100 2>&1 | grep -E "^fused|error" | sed "s/^/round $round forward only b$b: /"
        done
      done ;;
    inprogram)
      export_cache gpt2
      for b in ${BATCHES:-32 1}; do
        for setting in ${SETTINGS:--}; do
          vars=(); [ "$setting" = - ] || IFS=, read -ra vars <<< "$setting"
          tag=b$b-${setting//[^A-Za-z0-9]/_}
          echo "--- b$b $setting"
          env "${vars[@]}" FUSEC_CACHE_DIR="/tmp/inprogram-${setting//[^A-Za-z0-9]/_}" timeout 240 .gpu/fusec bench \
            .bench-work/gpt2_small_cache.onnx --dim batch=$b --dim seq=1 --dim past=256 --dim total=257 --precision fp16 \
            --cache-in-place --profile --in-program --json "$OUT/res/inprogram-$tag.json" 2>&1 \
            | grep -E "^fused|^unfused|in program|error" | cut -c1-200
          python3 scripts/in_program.py "$OUT/res/inprogram-$tag.json"
        done
      done ;;
    tuneab)
      export_cache gpt2
      for round in $(seq 1 "${ROUNDS:-1}"); do
        for b in ${BATCHES:-32 8}; do
          for setting in ${SETTINGS:--}; do
            vars=(); [ "$setting" = - ] || IFS=, read -ra vars <<< "$setting"
            dir="/tmp/tuneab-$round-$b-${setting//[^A-Za-z0-9]/_}"; rm -rf "$dir"
            echo "--- round $round b$b $setting"
            env "${vars[@]}" FUSEC_CACHE_DIR="$dir" timeout 120 .gpu/fusec bench .bench-work/gpt2_small_cache.onnx \
              --dim batch=$b --dim seq=1 --dim past=384 --dim total=385 --precision fp16 --cache-in-place 2>&1 \
              | grep -E "^fused|^  [0-9]+x|programmatic dependent|error" | cut -c1-180
          done
        done
      done ;;
    cnncheck)
      C=.bench-work/cnn
      M="resnet50 mobilenet_v3_large efficientnet_b0 convnext_tiny vit_b_16"
      [ -f $C/x_1.npy ] || timeout 200 python3 benches/export_cnn.py $C $M 2>&1 | grep -v Warning | tail -1
      for m in $M; do
        echo "--- $m ${PRECISION:-fp32} $(date -u +%T)"
        timeout 60 .gpu/fusec compile $C/$m.onnx -o /tmp/check.bundle --dim batch=1 --precision "${PRECISION:-fp32}" 2>&1 | grep -E "error"
        timeout 60 .gpu/fusec run /tmp/check.bundle --input x=$C/x_1.npy --check 2>&1 | grep -E "check|error"
      done ;;
    cnn)
      C=.bench-work/cnn
      timeout 300 python3 benches/export_cnn.py $C ${CNN_MODELS:-resnet50 mobilenet_v3_large} 2>&1 | grep -v Warning | tail -4
      for m in ${CNN_MODELS:-resnet50 mobilenet_v3_large}; do
        echo "--- $m"
        .gpu/fusec inspect $C/$m.onnx --dim batch=1 2>&1 | grep -E "unsupported|ONNX nodes" | cut -c1-300
        timeout 240 .gpu/fusec run $C/$m.onnx --input x=$C/x_1.npy --check 2>&1 | tail -3
        for p in fp32 fp16; do
          timeout 200 .gpu/fusec bench $C/$m.onnx --dim batch=8 --precision $p --iters 30 --warmup 5 --strict \
            --json "$OUT/res/cnn-$m-$p.json" 2>&1 | grep -E "^fused|^unfused|speedup|warning|error"
          echo "bench --strict exit: ${PIPESTATUS[0]}"
        done
      done
      [ -n "${CNN_TORCH-1}" ] && timeout 300 python3 benches/compare_torch_cnn.py --json "$OUT/res/torch-cnn.json" \
        --models "$(echo ${CNN_MODELS:-resnet50 mobilenet_v3_large} | tr ' ' ,)" 2>&1 | grep -E "median_ms|Error"
      ;;
    variants)
      export_models bert_base
      for w in 4 2 1; do
        echo "--- FUSEC_ATTENTION_WARPS=$w"
        FUSEC_ATTENTION_WARPS=$w timeout 200 .gpu/fusec bench .bench-work/bert_base.onnx --dim batch=8 --dim seq=128 --precision fp16 --iters 100 --profile --json "$OUT/res/variant-warps$w.json" | grep -E "^fused|attention|layernorm|GPU time" | head -8
      done
      ;;
    suite)
      export_models $models
      FUSEC=.gpu/fusec RESULTS="$OUT/res" PRECISIONS=fp16 FUSEC_MICRO=0 FUSEC_MODELS="$models" timeout 330 benches/run.sh fusec 2>&1 | grep -E "^==|^fused|^unfused|FAILED|speedup"
      ITERS=50 RESULTS="$OUT/res" TORCH_ARGS="--models ${models// /,} --dtypes fp16 --modes eager,reduce-overhead --no-micro" timeout 240 benches/run.sh torch 2>&1 | grep -E '"median_ms"|Error|error' | cut -c1-220
      ;;
    vocabbulk)
      timeout 300 bash benches/micro/vocab_bulk/run.sh ;;
    micro)
      export_models $models
      for chain in bias_gelu bias_dropout_residual_layernorm; do
        for shape in 4096x3072 8192x4096; do
          echo "== fusec bench ${chain}_$shape"
          timeout 120 .gpu/fusec bench ".bench-work/${chain}_$shape.onnx" --iters 100 --profile \
            --json "$OUT/res/fusec-${chain}-$shape-fp32.json" | grep -E "^fused|^unfused|speedup"
        done
      done
      timeout 240 python3 benches/compare_torch.py --iters 100 --json "$OUT/res/torch-micro.json" --micro-only \
        --modes eager,reduce-overhead 2>&1 | grep -E '"median_ms"|Error|error' | cut -c1-200
      ;;
    ab)
      export_models bert_base $models
      for build in old new; do
        bin=.gpu/fusec; [ $build = old ] && bin=.gpu/fusec-old
        echo "--- $build: compile bert_base fp16, cold then cached"
        rm -rf /tmp/cache-$build
        for i in 1 2 3; do
          FUSEC_CACHE_DIR=/tmp/cache-$build $bin compile .bench-work/bert_base.onnx -o /tmp/ab-$build.bundle --dim batch=8 --dim seq=128 --precision fp16 -v 2>&1 | tail -10
        done
      done
      for m in $models; do
        for build in old new; do
          bin=.gpu/fusec; [ $build = old ] && bin=.gpu/fusec-old
          echo "--- $build: bench $m 8x128 fp16"
          FUSEC_CACHE_DIR=/tmp/cache-$build timeout 200 $bin bench .bench-work/$m.onnx --dim batch=8 --dim seq=128 --precision fp16 --iters 200 --profile --json "$OUT/res/ab-$build-$m.json" | grep -E "^fused|^unfused|attention|speedup" | head -6
        done
      done
      ;;
    fp32)
      export_models $models
      shapes="${SHAPES:-1x128 32x128}"
      FUSEC=.gpu/fusec RESULTS="$OUT/res" PRECISIONS=fp32 SHAPES="$shapes" FUSEC_MICRO=0 FUSEC_MODELS="$models" timeout 330 benches/run.sh fusec 2>&1 | grep -E "^==|^fused|^unfused|FAILED|speedup"
      ITERS=50 RESULTS="$OUT/res" TORCH_ARGS="--models ${models// /,} --dtypes fp32 --shapes ${shapes// /,} --modes eager,reduce-overhead --no-micro" timeout 300 benches/run.sh torch 2>&1 | grep -E '"median_ms"|Error|error' | cut -c1-220
      ;;
    usability)
      [ -e .gpu/example-api ] && chmod +x .gpu/example-api
      .gpu/fusec --version
      .gpu/example-api
      .gpu/example-api models/bert_ts.onnx batch=2 seq=16
      .gpu/fusec compile models/bert_ts.onnx -o /tmp/bert.bundle --dim batch=2 --dim seq=16 --precision fp16 --json - | head -c 600; echo
      .gpu/fusec bench models/bert_ts.onnx --dim batch=2 --dim seq=16 --iters 50 --json - 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["schema"], d["schema_version"], [(v["variant"], round(v["median_ms"], 4)) for v in d["variants"]])'
      for case in .onnx-node-cases/*/; do echo "--- fusec run $case"; .gpu/fusec run "$case"; echo "exit $?"; done
      ;;
    gemms)
      export_models $models
      for shape in 8 1; do
        for m in $models; do
          for v in 0 ${VARIANTS:-24}; do
            echo "--- $m ${shape}x128 fp16, FUSEC_GEMM_VARIANTS=$v"
            rm -rf /tmp/gemm-cache
            FUSEC_CACHE_DIR=/tmp/gemm-cache FUSEC_GEMM_VARIANTS=$v RUST_LOG=fusec=debug timeout 200 .gpu/fusec bench .bench-work/$m.onnx \
              --dim batch=$shape --dim seq=128 --precision fp16 --iters 200 --profile --json "$OUT/res/gemms-$m-$shape-v$v.json" \
              2>"$OUT/res/gemms-$m-$shape-v$v.log" | grep -E "^fused|^unfused|cuBLAS|speedup" | cut -c1-240
            grep -c "GEMM candidate timed" "$OUT/res/gemms-$m-$shape-v$v.log"
          done
        done
      done
      ;;
    attn)
      export_models $models
      for shape in 8 32; do
        for m in $models; do
          for n in 1 2 4; do
            echo "--- $m ${shape}x128 fp16, FUSEC_ATTENTION_SPLITS=$n"
            FUSEC_ATTENTION_SPLITS=$n FUSEC_GEMM_VARIANTS=0 timeout 200 .gpu/fusec bench .bench-work/$m.onnx --dim batch=$shape --dim seq=128 \
              --precision fp16 --iters 200 --profile --json "$OUT/res/attn-$m-$shape-s$n.json" | grep -E "^fused|attention" | head -3
          done
        done
      done
      for n in 2 4; do
        echo "--- fixtures, FUSEC_ATTENTION_SPLITS=$n"
        FUSEC_ATTENTION_SPLITS=$n timeout 200 .gpu/test-gpu every_fixture --nocapture 2>&1 | grep -E "^test |test result|FAIL|panicked|mismatch" | head -20
      done
      ;;
    pdl)
      export_models $models
      for shape in 1 8 32; do
        for m in $models; do
          for p in 0 1 0 1; do
            echo "--- $m ${shape}x128 fp16, FUSEC_PDL=$p"
            FUSEC_PDL=$p timeout 200 .gpu/fusec bench .bench-work/$m.onnx --dim batch=$shape --dim seq=128 \
              --precision fp16 --iters 200 --profile --json "$OUT/res/pdl-$m-$shape-p$p.json" | grep -E "^fused|^unfused" | head -3
          done
        done
      done
      for m in $models; do
        for n in 2 4; do
          echo "--- $m 1x128 fp16, FUSEC_ATTENTION_SPLITS=$n"
          FUSEC_ATTENTION_SPLITS=$n timeout 200 .gpu/fusec bench .bench-work/$m.onnx --dim batch=1 --dim seq=128 \
            --precision fp16 --iters 200 --profile --json "$OUT/res/split-$m-1-s$n.json" | grep -E "^fused" | head -3
        done
      done
      echo "--- GPU tests with programmatic dependent launch"
      timeout 300 .gpu/test-gpu --nocapture 2>&1 | grep -E "^test |test result|FAIL|panicked|skipped"
      ;;
    readme)
      mkdir -p /tmp/readme && cp -r models /tmp/readme/ && chmod +x .gpu/* && (
        export PATH="$PWD/.gpu:$PATH"; cd /tmp/readme
        set -x
        fusec compile models/bert_ts.onnx -o bert.bundle --dim batch=2 --dim seq=16
        python3 -c "import numpy as np; np.save('ids.npy', np.random.randint(1, 512, (2, 16)))"
        fusec run bert.bundle --input input=ids.npy --check
        fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16 --fused | head -12
        fusec inspect models/bert_ts.onnx --dim batch=2 --dim seq=16 --precision fp16 --launches 2..8 --svg layer.svg
        ls -l layer.svg
        fusec bench models/bert_ts.onnx --dim batch=2 --dim seq=16
        fusec --version
        fusec cache info
        example-api
        set +x
      ) 2>&1
      ;;
    threads)
      cat /proc/sys/kernel/core_pattern
      crashes=0
      for i in $(seq 1 "${TRIES:-16}"); do
        FUSEC_ONNX_NODE_CASES=$PWD/.onnx-node-cases timeout "${SECS:-12}" .gpu/test-gpu onnx_node_cases sessions_on_several_threads cuda_graph_replay bundle_round_trip bad_inputs \
          > "$OUT/res/threads-$i.log" 2>&1
        rc=$?
        echo "run $i: exit $rc ($(grep -c '^test .* ok$' "$OUT/res/threads-$i.log") tests finished)"
        if grep -q "FUSEC CRASH REPORT" "$OUT/res/threads-$i.log"; then
          crashes=$((crashes + 1)); cp "$OUT/res/threads-$i.log" "$OUT/res/crash-$i.log"
        fi
        [ $rc = 124 ] || [ $rc = 0 ] || grep -E "panicked|FAILED|error" "$OUT/res/threads-$i.log" | head -5
      done
      echo "crash reports: $crashes"
      chmod +x .gpu/soak
      timeout 120 .gpu/soak threads models/bert_ts.onnx 8 1000
      timeout 150 .gpu/soak long models/bert_ts.onnx 100000
      timeout 60 .gpu/soak two models/bert_ts.onnx 1000
      timeout 120 .gpu/soak churn models/bert_ts.onnx 8 50
      timeout 60 .gpu/soak oom models/bert_ts.onnx
      ;;
    sanitizer)
      chmod +x .gpu/soak
      cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
      if [ -z "$cs" ]; then echo "compute-sanitizer: not found"; pip download nvidia-cuda-sanitizer-api 2>&1 | tail -1; else
        "$cs" --version | tail -1
        for tool in memcheck racecheck initcheck synccheck; do
          echo "--- $tool: soak two"
          timeout 150 "$cs" --tool $tool --error-exitcode 9 .gpu/soak two models/bert_ts.onnx 2 2>&1 | tail -4; echo "exit ${PIPESTATUS[0]}"
        done
        for tool in memcheck racecheck initcheck; do
          echo "--- $tool: soak two, fp16 (tensor-core attention)"
          FUSEC_SOAK_FP16=1 timeout 150 "$cs" --tool $tool --error-exitcode 9 .gpu/soak two models/bert_ts.onnx 2 2>&1 | tail -3; echo "exit ${PIPESTATUS[0]}"
        done
        echo "--- memcheck: the GPU test suite, $SANITIZE_SECS s at most"
        timeout "${SANITIZE_SECS:-300}" "$cs" --tool memcheck --error-exitcode 9 .gpu/test-gpu --test-threads=4 2>&1 \
          | grep -E "^test |test result|ERROR SUMMARY|Invalid|panicked" | head -20; echo "exit ${PIPESTATUS[0]}"
      fi
      ;;
    racecheck)
      # One fixture at a time (the whole suite under racecheck runs past a call), then the
      # other GPU tests one by one; each cut off after $RACE_SECS (default 90).
      cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
      for f in models/*.onnx; do
        f=$(basename "$f")
        printf -- "--- racecheck %s: " "$f"
        FUSEC_GPU_FIXTURES=$f timeout "${RACE_SECS:-90}" "$cs" --tool racecheck --error-exitcode 9 \
          .gpu/test-gpu every_fixture_matches_tract_on_the_gpu --exact 2>&1 \
          | grep -E "ERROR SUMMARY|test result|Race|panicked" | tr '\n' ' '; echo "exit ${PIPESTATUS[0]}"
      done
      for t in $(.gpu/test-gpu --list 2>/dev/null | sed -n 's/: test$//p' | grep -v -e every_fixture -e onnx_node); do
        printf -- "--- racecheck %s: " "$t"
        timeout "${RACE_SECS:-90}" "$cs" --tool racecheck --error-exitcode 9 .gpu/test-gpu "$t" --exact 2>&1 \
          | grep -E "ERROR SUMMARY|test result|Race|panicked" | tr '\n' ' '; echo "exit ${PIPESTATUS[0]}"
      done
      ;;
    all)
      deadline=$(( $(date +%s) + ${BUDGET:-570} ))
      left() { local n=$(( deadline - $(date +%s) - ${1:-0} )); [ $n -gt 1 ] && echo $n || echo 1; }
      t=$(date +%s); export_models bert_base gpt2_small llama_style; echo "export: $(( $(date +%s) - t )) s"
      t=$(date +%s)
      FUSEC=.gpu/fusec RESULTS="$OUT/res" timeout "$(left 300)" benches/run.sh fusec 2>&1 | grep -E "^==|^fused|^unfused|FAILED|speedup"
      echo "fusec: $(( $(date +%s) - t )) s"
      t=$(date +%s)
      RESULTS="$OUT/res" TORCH_ARGS="${TORCH_ARGS:-}" timeout "$(left 15)" benches/run.sh torch 2>&1 \
        | grep -E '"median_ms"|Error|error' | cut -c1-400
      echo "torch: $(( $(date +%s) - t )) s"
      python3 benches/report.py "$OUT/res" "$OUT/res/RESULTS.md" "$OUT/res/latency.svg"
      ;;
  esac
done
tar czf "$OUT/res.tgz" -C "$OUT" res
} 2>&1 | tee -a "$OUT/log.txt"
