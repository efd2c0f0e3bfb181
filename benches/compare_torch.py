#!/usr/bin/env python3
"""PyTorch on the benchmark suite: eager, torch.compile, and
torch.compile(mode="reduce-overhead"), timed the way `fusec bench` times (CUDA events around
each call after a warm-up, several input sets rotated, median / p10 / p90).

    python3 benches/compare_torch.py --json OUT.json [--models ...] [--dtypes ...] [--micro-only]
        [--decode 128x256 [--decode-batches 1,8]]

Every compiled variant's output is checked against eager f32 before it is timed (rel-L2;
bound 1e-4 for f32, 2e-2 for f16 whose reference is still f32); a failed check is recorded
and the timing kept out of the table. Each shape is compiled afresh (torch._dynamo.reset()),
static, as fusec compiles each shape. TF32 stays off, as in fusec's f32 GEMMs.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402

MODES = ["eager", "compile", "reduce-overhead"]


def percentiles(times):
    times = sorted(times)
    at = lambda q: times[round((len(times) - 1) * q)]  # noqa: E731
    return at(0.5), at(0.1), at(0.9)


def time_calls(fn, input_sets, warmup, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + iters):
        args = input_sets[i % len(input_sets)]
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return percentiles(times)


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    return float(torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def variants(module, modes):
    for mode in modes:
        if mode == "eager":
            yield mode, module, 0.0
        else:
            torch._dynamo.reset()
            kwargs = {"mode": "reduce-overhead"} if mode == "reduce-overhead" else {}
            yield mode, torch.compile(module, dynamic=False, **kwargs), None


def run_case(records, label, module_f32, make_inputs, dtype, args, extra, modes):
    """Times every mode of one (model, shape, dtype) case and appends a record per mode."""
    torch_dtype = torch.float16 if dtype == "fp16" else torch.float32
    input_sets = [make_inputs(seed) for seed in range(4)]
    with torch.no_grad():
        reference = module_f32(*input_sets[0]).float()
    module = module_f32 if dtype == "fp32" else module_f32.to(torch_dtype)
    if dtype != "fp32":
        input_sets = [[t.to(torch_dtype) if t.is_floating_point() else t for t in s] for s in input_sets]
    bound = 1e-4 if dtype == "fp32" else 2e-2
    for mode, fn, _ in variants(module, modes):
        record = dict(system=f"torch {mode}", case=label, dtype=dtype, **extra)
        case_start = time.perf_counter()
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                out = fn(*input_sets[0])
                torch.cuda.synchronize()
                record["first_call_s"] = time.perf_counter() - t0
                err = rel_l2(out.float(), reference)
                record["rel_l2_vs_eager_f32"] = err
                record["check"] = "pass" if err <= bound else "FAIL"
                median, p10, p90 = time_calls(fn, input_sets, args.warmup, args.iters)
            record.update(median_ms=median, p10_ms=p10, p90_ms=p90)
        except Exception as e:  # record and go on: one failure must not hide the rest
            record.update(check="error", error=f"{type(e).__name__}: {e}"[:500])
        record["case_s"] = round(time.perf_counter() - case_start, 2)
        print(json.dumps(record), flush=True)
        records.append(record)
        save(args, records)
    if dtype != "fp32":
        module_f32.float()
    torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--models", default=",".join(suite.MODELS))
    parser.add_argument("--dtypes", default=",".join(suite.DTYPES))
    parser.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in suite.SHAPES),
                        help="batch x sequence, comma-separated (default: the suite's)")
    parser.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    parser.add_argument("--compile-shapes", default=None,
                        help="shapes at which the default-mode torch.compile runs (default: all of --shapes); "
                             "it runs last, after reduce-overhead on every shape")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--no-micro", action="store_true")
    parser.add_argument("--micro-only", action="store_true")
    parser.add_argument("--decode", metavar="PROMPTxNEW",
                        help="also PyTorch's greedy decoding (benches/decode_torch.py: eager with the dynamic "
                             "cache, static cache under torch.compile) of the decoders models/export_cache.py "
                             "exports (--size small), e.g. 128x256, into the JSON's \"decode\" list")
    parser.add_argument("--decode-batches", default="1,8", help="batch sizes of --decode")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    records = []
    # Cheapest first (every run is cut off by the caller's time limit at some point): eager on
    # every case, then the pointwise chains in all modes, then the models under
    # reduce-overhead (the fastest PyTorch mode on every row measured), then under the default
    # mode (at --compile-shapes).
    wanted_modes = args.modes.split(",")
    parse = lambda text: [tuple(int(n) for n in shape.split("x")) for shape in text.split(",")]  # noqa: E731
    all_shapes = parse(args.shapes)
    compile_shapes = parse(args.compile_shapes) if args.compile_shapes else all_shapes
    phases = [(["eager"], not args.micro_only, False, all_shapes), (MODES, not args.no_micro, True, []),
              (["reduce-overhead"], not args.micro_only, False, all_shapes),
              (["compile"], not args.micro_only, False, compile_shapes)]
    for modes, wanted, micro, shapes in phases:
        modes = [m for m in modes if m in wanted_modes]
        if not wanted or not modes:
            continue
        if micro:
            for name in suite.MICRO:
                for rows, hidden in suite.MICRO_SHAPES:
                    module = suite.build_micro(name, hidden).to(dev)
                    def make_inputs(seed, rows=rows, hidden=hidden, n=len(suite.micro_inputs(name))):
                        g = torch.Generator().manual_seed(2000 + seed)
                        return [(torch.rand(rows, hidden, generator=g) * 2 - 1).to(dev) for _ in range(n)]
                    run_case(records, name, module, make_inputs, "fp32", args,
                             dict(rows=rows, hidden=hidden), modes)
            continue
        for name in args.models.split(","):
            module = suite.build(name).to(dev)
            for batch, seq in shapes:
                def make_inputs(seed, batch=batch, seq=seq, name=name):
                    g = torch.Generator().manual_seed(1000 + seed)
                    if name in suite.MASKED:
                        return [t.to(dev) for t in suite.masked_inputs(name, batch, seq, g)]
                    return [torch.randint(1, suite.VOCAB_IDS, (batch, seq), generator=g).to(dev)]
                for dtype in args.dtypes.split(","):
                    run_case(records, name, module, make_inputs, dtype, args,
                             dict(batch=batch, seq=seq), modes)
            del module
    save(args, records)
    if args.decode:
        # Decoding last: its own models (the decoders with a cache), its own timing
        # (generate, wall clock around a synchronised call, as benches/decode_torch.py).
        from decode_torch import measure as measure_decode
        prompt, new = (int(n) for n in args.decode.split("x"))
        decode = []
        for name in ["gpt2", "llama"]:
            for batch in (int(b) for b in args.decode_batches.split(",")):
                for result in measure_decode(name, "small", prompt, new, batch, "fp16"):
                    print(json.dumps(result), flush=True)
                    decode.append(result)
                    save(args, records, decode)


def save(args, records, decode=None):
    """Rewritten after every record, so a run cut short keeps what it measured."""
    meta = dict(torch=torch.__version__, device=torch.cuda.get_device_name(0),
                cuda=torch.version.cuda)
    try:
        import transformers
        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    document = dict(meta=meta, records=records)
    if decode is not None:
        document["decode"] = decode
    with open(args.json, "w") as f:
        json.dump(document, f, indent=1)


if __name__ == "__main__":
    main()
