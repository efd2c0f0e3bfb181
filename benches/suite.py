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


def build(name, seed=0):
    """The model `name` in eval mode (f32, on the CPU), wrapped as forward(ids) -> hidden."""
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
