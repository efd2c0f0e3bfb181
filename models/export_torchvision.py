#!/usr/bin/env python3
"""Exports a tiny torchvision `VisionTransformer` (the class `vit_b_16` is made of: class token,
`nn.MultiheadAttention`, the class token's row read out by `x[:, 0]` before the head) with
random seeded weights, for fusec's tests of models that read some rows of the last layer only.

    python3 models/export_torchvision.py OUT_DIR

Writes OUT_DIR/vit_tv_ts.onnx (TorchScript exporter, opset 17) and OUT_DIR/vit_tv_dynamo.onnx
(dynamo exporter, opset 18, where it exports): 32×32 images, patch 8, hidden 64, 2 layers, 4
heads, MLP 128, 10 classes; input `x` f32 [batch, 3, 32, 32], output `logits` [batch, 10]. The
head, LayerNorm scales and biases (zeros and ones as torchvision initialises them) are drawn
at random, so that every affine path is tested.
"""

import os
import sys

import torch
import torchvision


def build():
    torch.manual_seed(7)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                 hidden_dim=64, mlp_dim=128, num_classes=10)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.Linear)) and m.bias is not None:
                torch.nn.init.normal_(m.bias, std=0.1)
            if isinstance(m, torch.nn.LayerNorm):
                torch.nn.init.normal_(m.weight, mean=1.0, std=0.1)
        torch.nn.init.normal_(model.heads.head.weight, std=0.1)
        torch.nn.init.normal_(model.class_token, std=0.5)
    return model.eval()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    model = build()
    x = torch.randn(2, 3, 32, 32)
    path = os.path.join(out, "vit_tv_ts.onnx")
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    print(f"wrote {path}")
    path = os.path.join(out, "vit_tv_dynamo.onnx")
    try:
        batch = torch.export.Dim("batch", min=1, max=64)
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["logits"],
                          dynamic_shapes={"x": {0: batch}}, opset_version=18, dynamo=True, external_data=False)
        print(f"wrote {path}")
    except Exception as error:  # noqa: BLE001 - report and go on: the TorchScript export is the fixture
        print(f"dynamo export failed: {error}")


if __name__ == "__main__":
    main()
