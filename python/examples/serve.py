#!/usr/bin/env python3
"""One range bundle serving requests of different batch sizes and sequence lengths from one
session: what a serving engine's Python model (Triton's Python backend, Ray Serve) calls.

    python3 python/examples/serve.py [models/bert_mask_ts.onnx]

Compiles once for batch 1..8 × seq 1..64, then answers requests of several shapes; each
answer is checked against ONNX Runtime on the CPU when it is installed. Without a GPU it
compiles, prints what the bundle takes, and says why it stops.
"""

import sys

import numpy as np

import fusec

model = sys.argv[1] if len(sys.argv) > 1 else "models/bert_mask_ts.onnx"
bundle = fusec.compile(model, dims={"batch": (1, 8), "seq": (1, 64)}, precision="fp16")
print(bundle)
for spec in bundle.inputs:
    print(f"  input  {spec['name']}: {spec['dtype']}{spec['shape']}")
for spec in bundle.outputs:
    print(f"  output {spec['name']}: {spec['dtype']}{spec['shape']}")
if not fusec.cuda_available():
    sys.exit("no CUDA driver on this machine: the bundle compiled; running it needs an NVIDIA GPU")

session = fusec.Session(bundle)  # one session, every shape of the ranges
try:
    import onnxruntime

    reference = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
except ImportError:
    reference = None
rng = np.random.default_rng(0)
for batch, seq in [(1, 7), (8, 64), (3, 21), (1, 7)]:
    ids = rng.integers(1, 512, (batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), np.int64)
    types = np.zeros((batch, seq), np.int64)
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    (hidden,) = session.run(None, feed)
    line = f"request {batch}x{seq}: last_hidden_state {hidden.shape}"
    if reference is not None:
        (want,) = reference.run(None, feed)
        error = np.linalg.norm(hidden - want) / np.linalg.norm(want)
        line += f", rel-L2 against ONNX Runtime {error:.1e} (fp16)"
    print(line)
