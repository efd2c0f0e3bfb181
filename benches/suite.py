"""What the benchmark suite measures, shared by export.py and compare_torch.py so that fusec
and PyTorch run the same architectures at the same shapes.

Models are Hugging Face BERT-base and GPT-2 small with their default configurations, and a
Llama-style decoder (LlamaConfig: hidden 768, 12 layers, 12 heads, 4 key-value heads,
intermediate 2048, vocabulary 32000), all with random (seeded) weights; biases and norm scales are re-drawn so no affine path is trivially
zero or one. The pointwise chains are the two every transformer layer has.
"""

import torch

MODELS = ["bert_base", "gpt2_small", "llama_style"]
SHAPES = [(1, 128), (8, 128), (32, 128)]          # batch x sequence
DTYPES = ["fp32", "fp16"]
MICRO_SHAPES = [(4096, 3072), (8192, 4096)]       # rows x hidden
MICRO = ["bias_gelu", "bias_dropout_residual_layernorm"]
VOCAB_IDS = 1000                                  # token ids are drawn from [1, 1000)


class LastHidden(torch.nn.Module):
    """Hugging Face models take keyword inputs; the exporters want a positional forward(x)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(input_ids=x).last_hidden_state


class Masked(torch.nn.Module):
    """Token ids and the padding mask (and BERT's token type ids), as a tokenizer's padded batch
    feeds a served model."""

    def __init__(self, model, keywords):
        super().__init__()
        self.model = model
        self.keywords = keywords

    def forward(self, *inputs):
        return self.model(**dict(zip(self.keywords, inputs))).last_hidden_state


# The masked variants: the same models taking these inputs, in this order.
MASKED = {"bert_base_mask": ["input_ids", "attention_mask", "token_type_ids"],
          "gpt2_small_mask": ["input_ids", "attention_mask"]}


def masked_inputs(name, batch, seq, generator):
    """Inputs of a masked variant as fusec's `random_input` makes them: ids in [1, VOCAB_IDS),
    each row's mask right-padded to a length in [1, seq] (the first row full), token types
    0 then 1."""
    ids = torch.randint(1, VOCAB_IDS, (batch, seq), generator=generator)
    lengths = torch.randint(1, seq + 1, (batch,), generator=generator)
    lengths[0] = seq
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
    inputs = [ids, mask]
    if len(MASKED[name]) == 3:
        inputs.append((torch.arange(seq)[None, :] >= seq // 2).to(torch.int64).expand(batch, seq).contiguous())
    return inputs


def build(name, seed=0):
    """The model `name` in eval mode (f32, on the CPU), wrapped as forward(ids) -> hidden, or,
    for a masked variant (`MASKED`), forward(ids, mask[, token types]) -> hidden."""
    if name in MASKED:
        return Masked(build(name.removesuffix("_mask"), seed).model, MASKED[name]).eval()
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel
    torch.manual_seed(seed)
    if name == "bert_base":
        model = BertModel(BertConfig(), add_pooling_layer=False)
    elif name == "gpt2_small":
        model = GPT2Model(GPT2Config())
    elif name == "llama_style":
        model = LlamaModel(LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                       num_key_value_heads=4, intermediate_size=2048, vocab_size=32000,
                                       max_position_embeddings=512))
    else:
        raise ValueError(f"unknown model {name}")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0.0, 0.02)
            elif p.dim() == 1:
                p.normal_(1.0, 0.1)
    return LastHidden(model).eval()


class BiasGelu(torch.nn.Module):
    """gelu(x + b), exact (erf) GELU."""

    def __init__(self, hidden):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(hidden) * 0.02)

    def forward(self, x):
        return torch.nn.functional.gelu(x + self.bias)


class BiasDropoutResidualLayerNorm(torch.nn.Module):
    """layer_norm(dropout(x + b) + residual), inference (dropout is the identity)."""

    def __init__(self, hidden):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(hidden) * 0.02)
        self.norm = torch.nn.LayerNorm(hidden, eps=1e-12)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.norm.bias.normal_(0.0, 0.02)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x, residual):
        return self.norm(self.dropout(x + self.bias) + residual)


def build_micro(name, hidden, seed=0):
    torch.manual_seed(seed)
    module = BiasGelu(hidden) if name == "bias_gelu" else BiasDropoutResidualLayerNorm(hidden)
    return module.eval()


def micro_inputs(name):
    return ["x"] if name == "bias_gelu" else ["x", "residual"]
