#!/usr/bin/env python3
"""fusec's greedy decoding against PyTorch's on the decoders models/export_cache.py exports,
with the same weights (the model rebuilt as that script builds it: the same seed, the same
re-drawn biases and norm scales), on the GPU machine:

    python3 benches/decode_check.py --fusec .gpu/fusec --onnx-dir .bench-work --size small \
        [--model gpt2|llama] [--prompt 16] [--new 32] [--precisions fp32,fp16,bf16]

PyTorch runs `generate` greedily in f32 (its dynamic cache) after a random prompt; fusec runs
`fusec generate` on the exported file with the same prompt ids, in fp32 (the issue's check:
the first 32 tokens identical) and in fp16 (how many of the first tokens agree, for
information; `--precisions` names others, bf16 among them). Exit status 1 when the fp32
tokens differ.
"""

import argparse
import json
import re
import subprocess
import sys

import torch

sys.path.insert(0, "models")
from export_cache import configs  # noqa: E402


def build(size, wanted):
    """The model `wanted` exactly as export_cache.py's main() builds it."""
    torch.manual_seed(0)
    for name, model in configs(size):
        with torch.no_grad():
            for p_name, p in model.named_parameters():
                if p_name.endswith("bias"):
                    p.normal_(0.0, 0.02)
                elif p.dim() == 1:
                    p.normal_(1.0, 0.1)
        if name == wanted:
            return model.eval()
    raise SystemExit(f"no model {wanted}")


def fusec_tokens(fusec, onnx, prompt, new, precision):
    ids = ",".join(str(t) for t in prompt)
    out = subprocess.run([fusec, "generate", onnx, "--prompt-ids", ids, "--max-new-tokens", str(new),
                          "--precision", precision], capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("sequence 0:"))
    return [int(t) for t in re.sub(r"^sequence 0:\s*", "", line).split(",")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fusec", required=True)
    p.add_argument("--onnx-dir", required=True)
    p.add_argument("--size", default="small")
    p.add_argument("--model", default="gpt2")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--precisions", default="fp32,fp16")
    a = p.parse_args()
    model = build(a.size, a.model).cuda()
    vocab = model.config.vocab_size
    prompt = torch.randint(1, vocab, (1, a.prompt), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = model.generate(prompt.cuda(), attention_mask=torch.ones_like(prompt).cuda(), max_new_tokens=a.new,
                             min_new_tokens=a.new, do_sample=False, pad_token_id=0, eos_token_id=None)
    theirs = out[0, a.prompt:].tolist()
    onnx = f"{a.onnx_dir}/{a.model}_{a.size}_cache.onnx"
    ours = {p: fusec_tokens(a.fusec, onnx, prompt[0].tolist(), a.new, p) for p in a.precisions.split(",")}
    same = lambda x: next((i for i, (u, v) in enumerate(zip(x, theirs)) if u != v), len(theirs))  # noqa: E731
    result = {"model": f"{a.model}_{a.size}", "prompt": a.prompt, "new": a.new}
    if "fp32" in ours:
        result["fp32_identical"] = ours["fp32"] == theirs
    result.update({f"{p}_first_difference": same(t) for p, t in ours.items()})
    print(json.dumps(result))
    ours32 = ours.get("fp32", theirs)
    if ours32 != theirs:
        print(f"PyTorch f32: {theirs}\nfusec fp32:  {ours32}")
        sys.exit(1)


if __name__ == "__main__":
    main()
