#!/usr/bin/env python3
"""The generation loop an ONNX Runtime script runs, on fusec by changing its import: a
decoder exported with its key/value cache, the prompt run once with nothing cached, then one
token a step, each step's `present` fed back as the next `past`.

    python3 python/examples/decode_loop.py [models/gpt2_cache_ts.onnx] [new tokens]

`dims` lists two sets of ranges, so the loop compiles two bundles once — the prompt (1..64
tokens after nothing cached) and every later step (one token after 0..511 cached) — rather
than one per cache length. Greedy tokens are checked against ONNX Runtime on the CPU when it
is installed. Without a GPU it says why it stops.
"""

import sys
import time

import numpy as np

import fusec as ort  # the only line an ONNX Runtime script changes (`import onnxruntime as ort`)

model = sys.argv[1] if len(sys.argv) > 1 else "models/gpt2_cache_ts.onnx"
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 16
session = ort.InferenceSession(
    model,
    providers=["CUDAExecutionProvider"],
    dims=[
        {"batch": (1, 4), "seq": (1, 64), "past": 0, "total": "past+seq"},
        {"batch": (1, 4), "seq": 1, "past": (0, 511), "total": "past+seq"},
    ],
)
inputs = {i.name: i for i in session.get_inputs()}
caches = [name for name in inputs if name.startswith("past_key_values")]
print(f"{model}: inputs {[(i.name, i.shape) for i in inputs.values()]}")
if not ort.cuda_available():
    sys.exit("no CUDA driver on this machine: running the loop needs an NVIDIA GPU")


def feed(tokens, past, cache):
    """A step of `tokens` after `past` cached positions; `cache` the last step's presents."""
    batch, seq = tokens.shape
    step = {
        "input_ids": tokens,
        "attention_mask": np.ones((batch, past + seq), np.int64),
        "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1)),
    }
    for name, value in zip(caches, cache or [None] * len(caches)):
        if value is None:  # nothing cached yet: an empty cache of the declared heads and size
            _, heads, _, size = inputs[name].shape
            value = np.zeros((batch, heads, 0, size), np.float32)
        step[name] = value
    return step


def generate(run, prompt):
    tokens, cache, times = prompt, None, []
    for n in range(new_tokens):
        past = 0 if n == 0 else tokens.shape[1] - 1
        start = time.perf_counter()
        outputs = run(feed(tokens if n == 0 else tokens[:, -1:], past, cache))
        times.append(time.perf_counter() - start)
        tokens = np.concatenate([tokens, outputs[0][:, -1].argmax(-1)[:, None].astype(np.int64)], axis=1)
        cache = outputs[1:]
    return tokens, times


prompt = np.array([[5, 17, 301, 42, 9], [11, 480, 2, 64, 128]], np.int64)
tokens, times = generate(lambda f: session.run(None, f), prompt)
for row in tokens:
    print("tokens", row[prompt.shape[1] :].tolist())
steps = sorted(times[2:])
print(f"prompt step {times[0] * 1e3:.1f} ms (its first run compiles), later steps {steps[len(steps) // 2] * 1e3:.2f} ms (median)")
try:
    import onnxruntime
except ImportError:
    sys.exit(0)
reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
theirs, _ = generate(lambda f: reference.run(None, f), prompt)
print("the same tokens as ONNX Runtime (CPU):", bool((theirs == tokens).all()))
