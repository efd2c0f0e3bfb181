#!/usr/bin/env python3
"""Exports torchvision classifiers (random seeded weights) with the TorchScript exporter
(opset 17) for fusec's convolutional-network checks, and an input for each.

    python3 benches/export_cnn.py OUT_DIR [resnet50 mobilenet_v3_large ...]

Writes OUT_DIR/<name>.onnx (batch and size fixed: 1x3x224x224, a symbolic batch) and
OUT_DIR/x_<batch>.npy inputs. The BatchNormalization statistics are measured on random
batches first (`calibrate`): with the initial ones (mean 0, variance 1) the activations of a
deep random network shrink layer by layer, MobileNetV3's and EfficientNet's logits to ~1e-10,
below what fp16 holds, and a check of an fp16 build against the reference would compare
zeros.
"""

import os
import sys

import numpy as np
import torch
import torchvision


def unzero(model):
    """Linear layers torchvision initialises to zeros (ViT's classifier head) drawn at random
    instead: with them the logits are all zeros and no check compares anything."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not m.weight.detach().any():
            torch.nn.init.normal_(m.weight, std=0.02)
            torch.nn.init.normal_(m.bias, std=0.02)
    return model


def calibrate(model):
    """Every BatchNorm's running statistics from a few random batches (train mode, a
    cumulative average), then eval mode: activations of order 1, as in a trained network."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(8, 3, 224, 224))
    return model.eval()


def half_error(model, x, dtype=torch.float16):
    """rel-L2 of PyTorch's own logits in `dtype` (fp16 or bf16; channels-last, on the GPU)
    against its fp32 ones on `x`: what a half-precision build of this model can be expected to
    hold to."""
    if not torch.cuda.is_available():
        return None
    with torch.no_grad():
        model = model.cuda().to(memory_format=torch.channels_last)
        x = torch.from_numpy(x).cuda().to(memory_format=torch.channels_last)
        full = model(x).double()
        half = model.to(dtype)(x.to(dtype)).double()
        model.float().cpu()
    return float((half - full).norm() / full.norm())


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or ["resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny"]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    inputs = {batch: rng.standard_normal((batch, 3, 224, 224)).astype(np.float32) for batch in (1, 8)}
    for batch, x in inputs.items():
        np.save(os.path.join(out, f"x_{batch}.npy"), x)
    for name in names:
        model = calibrate(unzero(getattr(torchvision.models, name)(weights=None)))
        x = torch.randn(1, 3, 224, 224)
        path = os.path.join(out, f"{name}.onnx")
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                          dynamo=False)
        error, bf16 = half_error(model, inputs[1]), half_error(model, inputs[1], torch.bfloat16)
        print(f"wrote {path}" + (f"; PyTorch fp16 / bf16 against fp32 on x_1: rel-L2 {error:.3e} / {bf16:.3e}"
                                 if error else ""))


if __name__ == "__main__":
    main()
