# Writes a one-token step's inputs for a decoder with a cache into DIR: usage
# step_check.py MODEL.onnx DIR B PAST. B sequences after PAST cached positions, each sequence at
# a length of its own, ids below 30,000, the caches f32 as the model declares them, of values fp16
# holds exactly (fusec run converts them to the f16 a --cache-in-place fp16 bundle takes). Prints
# two lines: the --input shapes for fusec compile (as the model declares its types) and the
# --input NAME=FILE pairs for fusec run --check (part `stepcheck` of scripts/gpu-call.sh).
import os, sys
import numpy as np
import onnx
path, d, b, past = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
model = onnx.load(path, load_external_data=False)
rng = np.random.default_rng(7)
shapes, files = [], []
for inp in model.graph.input:
    name = inp.name
    dims = [x.dim_value for x in inp.type.tensor_type.shape.dim]
    if name == "input_ids":
        a = rng.integers(0, 30000, (b, 1)).astype(np.int64)
    elif name == "attention_mask":
        a = np.ones((b, past + 1), np.int64)
        for i in range(b):
            a[i, past - (i * 37) % past: past] = 0
    elif name == "position_ids":
        a = np.full((b, 1), 100, np.int64)
    elif name.startswith("past"):
        a = rng.uniform(-1, 1, (b, dims[1], past, dims[3])).astype(np.float16).astype(np.float32)
    else:
        raise SystemExit(f"unknown input {name}")
    np.save(f"{d}/{name}.npy", a)
    ty = "i64" if a.dtype == np.int64 else "f32"
    shapes.append(f"--input {name}:{'x'.join(map(str, a.shape))}:{ty}")
    files.append(f"--input {name}={d}/{name}.npy")
print(" ".join(shapes))
print(" ".join(files))
