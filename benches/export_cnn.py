#!/usr/bin/env python3
"""Exports torchvision classifiers (random seeded weights) with the TorchScript exporter
(opset 17) for fusec's convolutional-network checks, and an input for each.

    python3 benches/export_cnn.py OUT_DIR [resnet50 mobilenet_v3_large ...]

Writes OUT_DIR/<name>.onnx (batch and size fixed: 1x3x224x224, a symbolic batch) and
OUT_DIR/x_<batch>.npy inputs.
"""

import os
import sys

import numpy as np
import torch
import torchvision


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or ["resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny"]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name in names:
        model = getattr(torchvision.models, name)(weights=None).eval()
        x = torch.randn(1, 3, 224, 224)
        path = os.path.join(out, f"{name}.onnx")
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                          dynamo=False)
        print(f"wrote {path}")
    rng = np.random.default_rng(1)
    for batch in (1, 8):
        np.save(os.path.join(out, f"x_{batch}.npy"), rng.standard_normal((batch, 3, 224, 224)).astype(np.float32))


if __name__ == "__main__":
    main()
