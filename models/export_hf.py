#!/usr/bin/env python3
"""Export the tiny random-init Hugging Face fixtures in models/.

Needs torch, transformers (5.x), onnx and onnxscript (the GPU machine has them; see
models/README.md). Each architecture is exported twice:

  * `<name>_ts.onnx`     TorchScript exporter (dynamo=False), opset 17
  * `<name>_dynamo.onnx` dynamo exporter (dynamo=True), opset 18

Batch and sequence dims are symbolic ("batch", "seq"), so importing needs `--dim` or `--input`.
Weights are random (seeded) and embedded: every file is self-contained and well under 1 MB.

    python3 models/export_hf.py OUT_DIR [name ...]
"""

import collections
import os
import sys
import traceback

import onnx
import torch
import transformers
from transformers import (BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel,
                          ViTConfig, ViTModel)


class LastHidden(torch.nn.Module):
    """Hugging Face models need keyword inputs; the exporters need a positional forward(x)."""

    def __init__(self, model, keyword):
        super().__init__()
        self.model = model
        self.keyword = keyword

    def forward(self, x):
        return self.model(**{self.keyword: x}).last_hidden_state


class Masked(torch.nn.Module):
    """Token ids plus the padding mask (and, where given, token type ids), as a tokenizer's
    batch feeds them: what a served model takes."""

    def __init__(self, model, keywords):
        super().__init__()
        self.model = model
        self.keywords = keywords

    def forward(self, a, b, c=None):
        given = dict(zip(self.keywords, (a, b, c)))
        return self.model(**given).last_hidden_state


def tiny_models():
    text = dict(vocab_size=512, max_position_embeddings=64)
    yield "bert", BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=128, **text)), "input_ids", "text"
    # BERT-base depth at the same tiny width: what the fusion benchmark saturates.
    yield "bert12", BertModel(BertConfig(hidden_size=64, num_hidden_layers=12,
                                         num_attention_heads=4, intermediate_size=128,
                                         **text)), "input_ids", "text"
    yield "gpt2", GPT2Model(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2,
                                       n_head=4)), "input_ids", "text"
    yield "llama", LlamaModel(LlamaConfig(hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, **text)), "input_ids", "text"
    # With the padding mask (and token types) as inputs, the way tokenizers batch text.
    yield "bert_mask", BertModel(BertConfig(hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=128,
                                            type_vocab_size=2, **text)), \
        ("input_ids", "attention_mask", "token_type_ids"), "masked"
    yield "gpt2_mask", GPT2Model(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2,
                                            n_head=4)), ("input_ids", "attention_mask"), "masked"
    yield "vit", ViTModel(ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128), add_pooling_layer=False), \
        "pixel_values", "image"


def randomize_biases_and_norms(model):
    """Hugging Face initialises every bias to 0 and every norm scale to 1, which would let
    a wrong bias or affine path pass unnoticed: give them random values instead."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
            elif p.dim() == 1:
                p.normal_(1.0, 0.1)


def example_input(kind, keywords=()):
    if kind == "text":
        return (torch.randint(0, 512, (2, 16), dtype=torch.int64),)
    if kind == "masked":
        ids = torch.randint(0, 512, (2, 16), dtype=torch.int64)
        # The second sequence is padded after 11 tokens (right padding, as tokenizers do).
        mask = torch.ones(2, 16, dtype=torch.int64)
        mask[1, 11:] = 0
        types = torch.zeros(2, 16, dtype=torch.int64)
        types[:, 8:] = 1
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return tuple(given[k] for k in keywords)
    return (torch.randn(2, 3, 32, 32),)


def make_self_contained(path):
    model = onnx.load(path, load_external_data=True)
    onnx.save(model, path, save_as_external_data=False)
    data = path + ".data"
    if os.path.exists(data):
        os.remove(data)
    return model


def export(name, module, kind, out_dir, dynamo):
    keywords = getattr(module, "keywords", ())
    x = example_input(kind, keywords)
    path = os.path.join(out_dir, f"{name}_{'dynamo' if dynamo else 'ts'}.onnx")
    if kind == "masked" and dynamo:
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("seq", min=1, max=64)
        torch.onnx.export(module, x, path, dynamo=True, opset_version=18,
                          input_names=list(keywords), output_names=["last_hidden_state"],
                          dynamic_shapes={p: {0: batch, 1: seq} for p in "abc"[:len(keywords)]},
                          external_data=False)
    elif kind == "masked":
        torch.onnx.export(module, x, path, dynamo=False, opset_version=17,
                          input_names=list(keywords), output_names=["last_hidden_state"],
                          dynamic_axes={**{k: {0: "batch", 1: "seq"} for k in keywords},
                                        "last_hidden_state": {0: "batch", 1: "seq"}})
    elif dynamo:
        seq_axis = {0: torch.export.Dim("batch", min=1, max=64)}
        if kind == "text":
            seq_axis[1] = torch.export.Dim("seq", min=1, max=64)
        torch.onnx.export(module, x, path, dynamo=True, opset_version=18,
                          input_names=["input"], output_names=["last_hidden_state"],
                          dynamic_shapes=({**seq_axis},), external_data=False)
    else:
        axes = {0: "batch", 1: "seq"} if kind == "text" else {0: "batch"}
        torch.onnx.export(module, x, path, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["last_hidden_state"],
                          dynamic_axes={"input": axes, "last_hidden_state": {0: "batch"}})
    model = make_self_contained(path)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    opset = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    print(f"{path}: {os.path.getsize(path)} bytes, opset {opset}, {len(model.graph.node)} nodes")
    print("   ", dict(sorted(ops.items())))


def main():
    out_dir = sys.argv[1]
    wanted = set(sys.argv[2:])
    os.makedirs(out_dir, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"onnx {onnx.__version__}")
    failures = 0
    torch.manual_seed(0)
    for name, model, keyword, kind in tiny_models():
        if wanted and name not in wanted:
            continue
        randomize_biases_and_norms(model)
        module = (Masked(model, keyword) if kind == "masked" else LastHidden(model, keyword)).eval()
        # bert12 exists for the fusion benchmark; one export of it is enough.
        for dynamo in (False,) if name == "bert12" else (False, True):
            try:
                with torch.no_grad():
                    export(name, module, kind, out_dir, dynamo)
            except Exception:  # keep going: report every architecture
                failures += 1
                print(f"FAILED {name} dynamo={dynamo}")
                traceback.print_exc()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
