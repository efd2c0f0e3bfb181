#!/usr/bin/env python3
"""PyTorch's decoding speed on the decoders models/export_cache.py exports (same configs,
random weights), for side-by-side figures with `fusec generate`: greedy `generate` of N new
tokens after a prompt, eager with the dynamic cache, and with a static cache under
torch.compile (generate compiles the forward itself for a static cache: reduce-overhead). Prints one JSON line per mode: time to
first token (a generate of one new token) and ms per token after it.

    python3 benches/decode_torch.py --model gpt2 --size small --prompt 8 --new 64 --batch 1
"""

import argparse
import json
import sys
import time

import torch

sys.path.insert(0, "models")
from export_cache import configs  # noqa: E402


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--size", default="small")
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--modes", default="eager,static-compiled")
    args = parser.parse_args()
    model = dict(configs(args.size))[args.model]
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    model = model.to("cuda", dtype).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt), device="cuda")
    mask = torch.ones_like(ids)
    for mode in args.modes.split(","):
        kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
        if mode == "static-compiled":
            # A static cache makes generate compile the forward itself (its compile_config:
            # reduce-overhead, CUDA graphs).
            kwargs["cache_implementation"] = "static"
        try:
            with torch.no_grad():
                def run(n):
                    return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **kwargs)
                run(args.new)  # warm-up (and compilation)
                run(args.new)
                first = timed(lambda: run(1), 5)
                whole = timed(lambda: run(args.new), 5)
            per_token = (whole - first) / (args.new - 1)
            print(json.dumps({"model": f"{args.model}_{args.size}", "mode": mode, "dtype": args.dtype,
                              "batch": args.batch, "prompt": args.prompt, "new": args.new,
                              "first_token_ms": round(first, 3), "ms_per_token": round(per_token, 4),
                              "tokens_per_s": round(args.batch * 1e3 / per_token, 1)}), flush=True)
        except Exception as e:  # report and go on to the next mode
            print(json.dumps({"model": args.model, "mode": mode, "error": str(e)[:300]}), flush=True)


if __name__ == "__main__":
    main()
