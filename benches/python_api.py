#!/usr/bin/env python3
"""fusec from Python next to PyTorch and ONNX Runtime, in one process (run on the GPU machine
with the fusec wheel installed or on PYTHONPATH; needs torch, transformers, onnx,
onnxruntime):

    python3 benches/python_api.py --onnx .bench-work/bert_base_mask.onnx --model bert_base_mask \
        [--batch 8 --seq 128 --precision fp16 --iters 300] [--json OUT.json]

1. Python overhead per run, two ways. The same call: `fusec.Session.run`'s wall time less the
   Rust API's part of that call timed inside it (`last_rust_seconds`), so the GPU's and the
   output copy's spread between calls falls out. And paired: the Rust API timed inside Rust (`fusec::Session::run`, host
   tensors in and out; and `run_host_on_device` with each output copied from the device into new memory, the same work
   `fusec.Session.run` does below Python) against `fusec.Session.run` (NumPy in and out) on
   the same session and inputs, wall clock; the overhead is the median difference of
   alternating pairs (a Rust-timed run, then a Python run), so drift falls on both (target:
   under 10 µs for a model with 3 inputs).
2. Device tensors: `run_torch` (PyTorch CUDA tensors in, DLPack views out), wall clock, with
   the zero copies asserted on data pointers.
3. PyTorch eager and torch.compile(mode="reduce-overhead") of the same model in the same
   precision, CUDA events around each call, median.
4. The ONNX Runtime script check: `fusec.InferenceSession(model).run(None, feed)` (fp32)
   against `onnxruntime.InferenceSession(model, CPUExecutionProvider)`: rel-L2 (target
   1e-5), and ONNX Runtime's CPU time per run for scale.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

import fusec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402


def wall(fn, iters, warmup=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cuda_events(fn, iters, warmup=20):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--onnx", required=True)
    p.add_argument("--model", required=True, help="the suite's name of the model (benches/suite.py)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--precision", default="fp16")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--json")
    p.add_argument("--skip-ort", action="store_true")
    p.add_argument("--skip-torch", action="store_true")
    a = p.parse_args()
    res = {"gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "model": a.model,
           "batch": a.batch, "seq": a.seq, "precision": a.precision}
    names = [i["name"] for i in fusec.summarize(a.onnx)["inputs"]]
    generator = torch.Generator().manual_seed(0)
    if a.model in suite.MASKED:
        tensors = suite.masked_inputs(a.model, a.batch, a.seq, generator)
    else:
        tensors = [torch.randint(1, suite.VOCAB_IDS, (a.batch, a.seq), generator=generator)]
    feed = {n: t.numpy() for n, t in zip(names, tensors)}

    t0 = time.perf_counter()
    bundle = fusec.compile(a.onnx, dims={"batch": a.batch, "seq": a.seq}, precision=a.precision)
    res["compile_s"] = time.perf_counter() - t0
    session = fusec.Session(bundle)
    print(f"{res['gpu']}: {a.model} {a.batch}x{a.seq} {a.precision}, {len(names)} inputs, "
          f"compiled in {res['compile_s']:.1f} s, {session.launches} launches")

    # 1. Python overhead against the Rust API. Rounds of medians, then pairs: one run timed
    # inside Rust (run_host with its output copies), then one Python run, alternately, so that
    # clock, cache and allocator drift fall on both alike; the overhead is the median of the
    # pairs' differences.
    rust, raw, python = [], [], []
    run = lambda: session.run(None, feed)  # noqa: E731
    for _ in range(3):
        rust.append(statistics.median(session.time_rust_run(feed, a.iters)))
        raw.append(statistics.median(session.time_rust_run(feed, a.iters, raw=True)))
        python.append(wall(run, a.iters))

    def paired(fn, output_names=None):
        """The median of (fn's wall time − one run_host timed inside Rust with the outputs
        `output_names` copied out), the two alternating."""
        diffs = []
        for _ in range(a.iters * 2):
            inner = session.time_rust_run(feed, 1, raw=True, warmup=False, output_names=output_names)[0]
            start = time.perf_counter()
            fn()
            diffs.append(time.perf_counter() - start - inner)
        return statistics.median(diffs)

    def same_call(fn):
        """Per call: fn's wall time less the Rust API's part of that same call, timed inside
        it (`last_rust_seconds`: the session's run and the output copies) — what Python and
        the binding add, free of the GPU's and the copies' spread between calls. Median,
        p10, p90 in µs."""
        for _ in range(20):
            fn()
        extra = []
        for _ in range(a.iters * 2):
            start = time.perf_counter()
            out = fn()
            extra.append(time.perf_counter() - start - session._session.last_rust_seconds)
            # Freed after the clock stops, as the Rust part's output is: what a caller's arrays
            # cost when they go is the caller's, in Rust as in Python.
            del out
        extra.sort()
        return [1e6 * extra[len(extra) // 2], 1e6 * extra[len(extra) // 10], 1e6 * extra[9 * len(extra) // 10]]

    res["python_overhead_same_call_us"] = same_call(run)
    res["python_overhead_same_call_no_outputs_us"] = same_call(lambda: session.run([], feed))
    print(f"Python overhead over the Rust API, the same call: {res['python_overhead_same_call_us'][0]:+.1f} µs "
          f"(p10 {res['python_overhead_same_call_us'][1]:+.1f}, p90 {res['python_overhead_same_call_us'][2]:+.1f}; "
          f"{a.iters * 2} runs); with no output fetched {res['python_overhead_same_call_no_outputs_us'][0]:+.1f} µs")
    pairs = a.iters * 2
    res["python_overhead_us"] = paired(run) * 1e6
    # The same pairs with no output fetched (`run([], feed)`): the Python layer's fixed cost,
    # apart from the output's bytes; and the binding alone (the Rust module's run_host_outputs,
    # no Python wrapper).
    res["python_overhead_no_outputs_us"] = paired(lambda: session.run([], feed), []) * 1e6
    items = [(n, np.ascontiguousarray(v)) for n, v in feed.items()]
    res["binding_overhead_no_outputs_us"] = paired(lambda: session._session.run_host_outputs(items, []), []) * 1e6
    # The wrapper's Python alone, no GPU: the feed's arrays checked and listed.
    res["wrapper_feed_us"] = wall(lambda: [(n, np.asarray(v)) for n, v in feed.items() if np.asarray(v).flags.c_contiguous], a.iters) * 1e6
    res["rust_run_us"] = statistics.median(rust) * 1e6
    res["rust_run_host_us"] = statistics.median(raw) * 1e6
    res["python_run_us"] = statistics.median(python) * 1e6
    res["python_vs_session_run_us"] = res["python_run_us"] - res["rust_run_us"]
    us = lambda xs: [round(x * 1e6, 1) for x in xs]  # noqa: E731
    print(f"run, host arrays: Rust Session::run {res['rust_run_us']:.1f} µs, Rust run_host_on_device + output copies "
          f"{res['rust_run_host_us']:.1f} µs, Python Session.run {res['python_run_us']:.1f} µs "
          f"(rounds: {us(rust)}, {us(raw)}, {us(python)}); Python overhead over run_host, paired: "
          f"{res['python_overhead_us']:+.1f} µs (median of {pairs} pairs); with no output fetched "
          f"{res['python_overhead_no_outputs_us']:+.1f} µs, of which the binding {res['binding_overhead_no_outputs_us']:+.1f} µs "
          f"and the wrapper's feed loop {res['wrapper_feed_us']:.1f} µs")

    # 2. Device tensors, no copies.
    on_gpu = {n: t.cuda() for n, t in zip(names, tensors)}
    bound = {}
    for n, t in on_gpu.items():
        buffer = session.input_tensor(n, t.shape)
        buffer.copy_(t)
        assert buffer.data_ptr() == session.input_address(n)
        bound[n] = buffer
    out = session.run_torch(bound)
    for n, t in out.items():
        assert t.data_ptr() == session.output_address(n), n
    host = session.run(None, feed)[0]
    res["run_torch_matches_run"] = bool(np.array_equal(out[next(iter(out))].cpu().numpy(), host))
    res["run_torch_bound_us"] = wall(lambda: session.run_torch(bound), a.iters) * 1e6
    res["run_torch_copied_us"] = wall(lambda: session.run_torch(on_gpu), a.iters) * 1e6
    res["run_torch_events_us"] = cuda_events(lambda: session.run_torch(bound), a.iters) * 1e6
    print(f"run_torch: bound inputs {res['run_torch_bound_us']:.1f} µs, copied inputs "
          f"{res['run_torch_copied_us']:.1f} µs (wall), {res['run_torch_events_us']:.1f} µs (CUDA events); "
          f"zero copies asserted on data pointers; equal to run(): {res['run_torch_matches_run']}")

    # 3. PyTorch in the same process.
    if a.skip_torch:
        a.skip_ort = True
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[a.precision]
    module = suite.build(a.model).cuda().to(dtype)
    args = [t.cuda() for t in tensors]
    with torch.no_grad():
        res["torch_eager_us"] = cuda_events(lambda: module(*args), 100) * 1e6
        compiled = torch.compile(module, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            compiled(*args)
        res["torch_reduce_overhead_us"] = cuda_events(lambda: compiled(*args), 200) * 1e6
        res["torch_vs_fusec_rel_l2"] = rel_l2(host, compiled(*args).float().cpu().numpy())
    print(f"PyTorch {a.precision}: eager {res['torch_eager_us']:.1f} µs, reduce-overhead "
          f"{res['torch_reduce_overhead_us']:.1f} µs (CUDA events); fusec run_torch / reduce-overhead "
          f"{res['run_torch_events_us'] / res['torch_reduce_overhead_us']:.2f}x; rel-L2 fusec vs torch "
          f"{res['torch_vs_fusec_rel_l2']:.1e}")

    # 4. An ONNX Runtime script, its import changed.
    if not a.skip_ort:
        import onnxruntime

        ours = fusec.InferenceSession(a.onnx)
        theirs = onnxruntime.InferenceSession(a.onnx, providers=["CPUExecutionProvider"])
        got = ours.run(None, feed)
        want = theirs.run(None, feed)
        res["ort_script_rel_l2"] = max(rel_l2(g, w) for g, w in zip(got, want))
        res["ort_cpu_us"] = wall(lambda: theirs.run(None, feed), 3, warmup=1) * 1e6
        res["inference_session_fp32_us"] = wall(lambda: ours.run(None, feed), 100) * 1e6
        print(f"InferenceSession fp32 vs ONNX Runtime CPU: rel-L2 {res['ort_script_rel_l2']:.1e}; "
              f"fusec {res['inference_session_fp32_us']:.0f} µs, ONNX Runtime CPU {res['ort_cpu_us']:.0f} µs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
