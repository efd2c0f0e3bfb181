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
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
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


def measure(name, size, prompt, new, batch, dtype_name="fp16", modes=("eager", "static-compiled")):
    """PyTorch's greedy `generate` of `new` tokens after a random `prompt`-token prompt for
    `batch` sequences, each mode: one dict a mode (time to first token, ms per token after
    it, tokens/s; or the error)."""
    model = dict(configs(size))[name]
    dtype = torch.float16 if dtype_name == "fp16" else torch.float32
    model = model.to("cuda", dtype).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    results = []
    for mode in modes:
        kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
        if mode == "static-compiled":
            # A static cache makes generate compile the forward itself (its compile_config:
            # reduce-overhead, CUDA graphs).
            kwargs["cache_implementation"] = "static"
        try:
            with torch.no_grad():
                def run(n):
                    return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, **kwargs)
                run(new)  # warm-up (and compilation)
                run(new)
                first = timed(lambda: run(1), 5)
                whole = timed(lambda: run(new), 5)
            per_token = (whole - first) / (new - 1)
            results.append({"model": f"{name}_{size}", "mode": mode, "dtype": dtype_name, "batch": batch,
                            "prompt": prompt, "new": new, "first_token_ms": round(first, 3),
                            "ms_per_token": round(per_token, 4), "tokens_per_s": round(batch * 1e3 / per_token, 1)})
        except Exception as e:  # report and go on to the next mode
            results.append({"model": f"{name}_{size}", "mode": mode, "error": str(e)[:300]})
    del model
    torch.cuda.empty_cache()
    return results


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
    for result in measure(args.model, args.size, args.prompt, args.new, args.batch, args.dtype,
                          args.modes.split(",")):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
