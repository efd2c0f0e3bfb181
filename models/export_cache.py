#!/usr/bin/env python3
"""Export decoders with their key/value cache, the layout Hugging Face Optimum and ONNX Runtime
GenAI use, with the TorchScript exporter (opset 17) or the dynamo exporter (`--dynamo`):

  inputs   input_ids [batch, seq] i64, attention_mask [batch, total] i64,
           position_ids [batch, seq] i64,
           past_key_values.{i}.key / .value [batch, kv_heads, past, head_dim] f32
  outputs  logits [batch, seq, vocab] f32,
           present.{i}.key / .value [batch, kv_heads, total, head_dim] f32

where total = past + seq: one file serves a prompt (past = 0) and each decoding step (seq = 1).
The model fills a `transformers.DynamicCache` from the past tensors and returns the cache it
extended. Weights are random (seeded), biases and norm scales re-drawn so every affine path
counts. After each export the file is run with onnx's reference evaluator against PyTorch at a
prompt (past 0, seq 5) and a step (past 5, seq 1).

  tiny (models/):  gpt2_cache_ts.onnx   GPT2LMHeadModel, n_embd 64, 2 layers, 4 heads, vocab 512
                   llama_cache_ts.onnx  LlamaForCausalLM, hidden 64, 2 layers, 4 heads (2 KV),
                                        vocab 512
  --size small:    gpt2_small_cache.onnx (GPT-2 small: 768 wide, 12 layers, vocab 50257) and
                   llama_small_cache.onnx (the suite's Llama-style decoder), for benchmarks

  --dynamo:        the dynamo exporter (opset 18) instead: <name>_cache_dynamo.onnx (tiny, models/
                   gpt2_cache_dynamo.onnx and llama_cache_dynamo.onnx) / <name>_small_cache_dynamo.onnx,
                   the same weights; it writes the presents' length as `past + seq`

  --forward:       also the same decoder (same weights) without a cache: input_ids,
                   attention_mask [batch, seq], position_ids in, logits out
                   (<name>_small_forward.onnx / <name>_forward_ts.onnx), the forward-only
                   model a prompt step is compared with

    python3 models/export_cache.py OUT_DIR [--size small] [--dynamo] [--forward] [gpt2 llama]
"""

import argparse
import collections
import os

import numpy as np
import onnx
import torch
import transformers
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def configs(size):
    if size == "small":
        yield "gpt2", GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257,
                                                 n_positions=1024))
        yield "llama", LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816,
                                                    num_hidden_layers=8, num_attention_heads=16,
                                                    num_key_value_heads=4, vocab_size=32000,
                                                    max_position_embeddings=2048))
        return
    yield "gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2,
                                             n_head=4))
    yield "llama", LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, vocab_size=512,
                                                max_position_embeddings=64))


def layer_kv(cache, i):
    """Layer i's keys and values of a DynamicCache (transformers 5: `.layers`)."""
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


class WithCache(torch.nn.Module):
    def __init__(self, model, layers):
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
        presents = []
        for i in range(self.layers):
            presents.extend(layer_kv(out.past_key_values, i))
        return (out.logits, *presents)


class Forward(torch.nn.Module):
    """The decoder over a whole sequence, no cache in or out: logits only."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False).logits


def export_forward(name, model, out_dir, size):
    file = f"{name}_forward_ts.onnx" if size == "tiny" else f"{name}_small_forward.onnx"
    path = os.path.join(out_dir, file)
    ids, mask, positions = feeds(model, 2, 0, 5, 1)[:3]
    axes = {n: {0: "batch", 1: "seq"} for n in ["input_ids", "attention_mask", "position_ids", "logits"]}
    with torch.no_grad():
        torch.onnx.export(Forward(model).eval(), (ids, mask, positions), path, dynamo=False,
                          opset_version=17, input_names=["input_ids", "attention_mask", "position_ids"],
                          output_names=["logits"], dynamic_axes=axes)
    onnx_model = onnx.load(path, load_external_data=True)
    onnx.save(onnx_model, path, save_as_external_data=False)
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")
    print(f"{path}: {os.path.getsize(path)} bytes, {len(onnx_model.graph.node)} nodes")


def shapes(model):
    c = model.config
    heads = c.num_attention_heads if hasattr(c, "num_attention_heads") else c.n_head
    kv = getattr(c, "num_key_value_heads", None) or heads
    hidden = getattr(c, "hidden_size", None) or c.n_embd
    layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    return layers, kv, hidden // heads, c.vocab_size


def feeds(model, batch, past, seq, seed):
    layers, kv, head_dim, vocab = shapes(model)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    positions = torch.arange(past, past + seq).unsqueeze(0).expand(batch, seq).contiguous()
    cache = [torch.randn(batch, kv, past, head_dim, generator=g) for _ in range(2 * layers)]
    return (ids, mask, positions, *cache)


def names(layers):
    inputs = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    for i in range(layers):
        inputs += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outputs += [f"present.{i}.key", f"present.{i}.value"]
    return inputs, outputs


def export_dynamo(module, args, path, inputs, outputs, layers):
    """The dynamo exporter (opset 18): named dimensions as strings, which it turns into
    dynamic dimensions and keeps as the file's names; where it cannot (a relation it will not
    take), every dimension left to it (`Dim.AUTO`) and named after the fact."""
    seq = {0: "batch", 1: "seq"}
    past = tuple({0: "batch", 2: "past"} for _ in range(2 * layers))
    named = (seq, {0: "batch", 1: "total"}, seq, past)
    auto = torch.export.Dim.AUTO
    automatic = ({0: auto, 1: auto}, {0: auto, 1: auto}, {0: auto, 1: auto},
                 tuple({0: auto, 2: auto} for _ in range(2 * layers)))
    for how, dynamic in [("named", named), ("automatic", automatic)]:
        try:
            torch.onnx.export(module, args, path, dynamo=True, opset_version=18, input_names=inputs,
                              output_names=outputs, dynamic_shapes=dynamic, external_data=False)
            print(f"    dynamo export with {how} dimensions")
            return
        except Exception as e:  # the next way, after saying why this one failed
            print(f"    dynamo export with {how} dimensions failed: {type(e).__name__}: {str(e)[:2000]}")
    raise SystemExit(f"{path}: the dynamo exporter failed both ways")


def dims_of(values):
    out = []
    for v in values:
        shape = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        out.append(f"{v.name} {shape}")
    return out


def export(name, model, out_dir, size, dynamo=False):
    layers, _, _, _ = shapes(model)
    module = WithCache(model, layers).eval()
    inputs, outputs = names(layers)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    for n in inputs[3:]:
        axes[n] = {0: "batch", 2: "past"}
    for n in outputs[1:]:
        axes[n] = {0: "batch", 2: "total"}
    kind = "dynamo" if dynamo else "ts"
    file = f"{name}_cache_{kind}.onnx" if size == "tiny" else f"{name}_small_cache{'_dynamo' if dynamo else ''}.onnx"
    path = os.path.join(out_dir, file)
    with torch.no_grad():
        if dynamo:
            export_dynamo(module, feeds(model, 2, 5, 3, 1), path, inputs, outputs, layers)
        else:
            torch.onnx.export(module, feeds(model, 2, 5, 3, 1), path, dynamo=False, opset_version=17,
                              input_names=inputs, output_names=outputs, dynamic_axes=axes)
    onnx_model = onnx.load(path, load_external_data=True)
    onnx.save(onnx_model, path, save_as_external_data=False)
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")
    ops = collections.Counter(n.op_type for n in onnx_model.graph.node)
    print(f"{path}: {os.path.getsize(path)} bytes, {len(onnx_model.graph.node)} nodes")
    print("   ", dict(sorted(ops.items())))
    for line in dims_of(onnx_model.graph.input) + dims_of(onnx_model.graph.output):
        print("    ", line)
    if size != "tiny":
        return
    # The file against PyTorch at a prompt (no past) and at a step.
    from onnx.reference import ReferenceEvaluator
    evaluator = ReferenceEvaluator(onnx_model)
    for batch, past, seq in [(2, 0, 5), (2, 5, 1)]:
        x = feeds(model, batch, past, seq, 7)
        with torch.no_grad():
            theirs = module(*x)
        ours = evaluator.run(None, {n: t.numpy() for n, t in zip(inputs, x)})
        worst = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(ours, theirs))
        print(f"    onnx reference at batch {batch}, past {past}, seq {seq}: max abs diff {worst:.2e}")
        assert worst < 1e-4, worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--size", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--forward", action="store_true")
    parser.add_argument("--dynamo", action="store_true")
    args = parser.parse_intermixed_args()
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, onnx {onnx.__version__}")
    torch.manual_seed(0)
    for name, model in configs(args.size):
        if args.names and name not in args.names:
            continue
        with torch.no_grad():
            for p_name, p in model.named_parameters():
                if p_name.endswith("bias"):
                    p.normal_(0.0, 0.02)
                elif p.dim() == 1:
                    p.normal_(1.0, 0.1)
        export(name, model.eval(), args.out_dir, args.size, args.dynamo)
        if args.forward:
            export_forward(name, model.eval(), args.out_dir, args.size)


if __name__ == "__main__":
    main()
