#!/usr/bin/env python3
"""PyTorch on the convolutional classifiers of `benches/export_cnn.py` (same seeded random
weights): eager and torch.compile(mode="reduce-overhead"), channels-last, timed as
`fusec bench` times (CUDA events around each call after a warm-up, median / p10 / p90).
TF32 stays off, as in fusec's f32 convolutions and GEMMs.

    python3 benches/compare_torch_cnn.py --json OUT.json [--models resnet50,...] [--batches 8]
                                         [--dtypes fp16] [--modes eager,reduce-overhead]
"""

import argparse
import json
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import percentiles  # noqa: E402


def time_calls(fn, x, warmup, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.inference_mode():
        for i in range(warmup + iters):
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
    return percentiles(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--models", default="resnet50,mobilenet_v3_large")
    parser.add_argument("--batches", default="8")
    parser.add_argument("--dtypes", default="fp16")
    parser.add_argument("--modes", default="eager,reduce-overhead")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        base = getattr(torchvision.models, name)(weights=None).eval().cuda()
        for dtype_name in args.dtypes.split(","):
            dtype = {"fp16": torch.float16, "fp32": torch.float32}[dtype_name]
            model = base.to(dtype=dtype, memory_format=torch.channels_last)
            for batch in [int(b) for b in args.batches.split(",")]:
                x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
                for mode in args.modes.split(","):
                    torch._dynamo.reset()
                    fn = model if mode == "eager" else torch.compile(model, mode=mode)
                    median, p10, p90 = time_calls(fn, x, args.warmup, args.iters)
                    row = {"model": name, "dtype": dtype_name, "batch": batch, "mode": mode,
                           "median_ms": median, "p10_ms": p10, "p90_ms": p90}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
