#!/usr/bin/env python3
"""Export the benchmark models to ONNX (run on the GPU machine: needs torch, transformers,
onnx).

    python3 benches/export.py OUT_DIR

writes OUT_DIR/bert_base.onnx and OUT_DIR/gpt2_small.onnx (TorchScript exporter, opset 17,
symbolic "batch" and "seq" dims, weights embedded) and the pointwise-chain models
OUT_DIR/<chain>_<rows>x<hidden>.onnx. The chains are written node by node the way the
TorchScript exporter spells them (GELU as x·½·(1 + erf(x/√2)), LayerNormalization), with the
Dropout node an inference-mode export of a training graph keeps, which fusec must remove.
"""

import os
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402


def export_model(name, out_dir):
    path = os.path.join(out_dir, f"{name}.onnx")
    module = suite.build(name)
    if name in suite.MASKED:
        names = suite.MASKED[name]
        args = tuple(suite.masked_inputs(name, 2, 16, torch.Generator().manual_seed(0)))
    else:
        names = ["input"]
        args = (torch.randint(1, suite.VOCAB_IDS, (2, 16), dtype=torch.int64),)
    axes = {n: {0: "batch", 1: "seq"} for n in names + ["last_hidden_state"]}
    with torch.no_grad():
        torch.onnx.export(module, args, path, dynamo=False, opset_version=17,
                          input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes)
    model = onnx.load(path, load_external_data=True)
    onnx.save(model, path, save_as_external_data=False)
    if os.path.exists(path + ".data"):
        os.remove(path + ".data")
    print(f"{path}: {os.path.getsize(path) / 1e6:.0f} MB, {len(model.graph.node)} nodes")


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def export_micro(name, rows, hidden, out_dir):
    module = suite.build_micro(name, hidden)
    bias = module.bias.detach().numpy()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, hidden])
    inits = [const("bias", bias)]
    if name == "bias_gelu":
        inputs = [x]
        inits += [const("sqrt2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5)]
        nodes = [
            helper.make_node("Add", ["x", "bias"], ["h"]),
            helper.make_node("Div", ["h", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["f"]),
            helper.make_node("Mul", ["h", "f"], ["g"]),
            helper.make_node("Mul", ["g", "half"], ["y"]),
        ]
    else:
        r = helper.make_tensor_value_info("residual", TensorProto.FLOAT, [rows, hidden])
        inputs = [x, r]
        inits += [const("gamma", module.norm.weight.detach().numpy()),
                  const("beta", module.norm.bias.detach().numpy()),
                  const("ratio", 0.1)]
        nodes = [
            helper.make_node("Add", ["x", "bias"], ["h"]),
            helper.make_node("Dropout", ["h", "ratio"], ["d"]),
            helper.make_node("Add", ["d", "residual"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1,
                             epsilon=1e-12),
        ]
    graph = helper.make_graph(nodes, name, inputs, [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="fusec benches/export.py")
    onnx.checker.check_model(model)
    path = os.path.join(out_dir, f"{name}_{rows}x{hidden}.onnx")
    onnx.save(model, path)
    print(f"{path}: {len(nodes)} nodes")


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name in os.environ.get("EXPORT_MODELS", " ".join(suite.MODELS)).split():
        export_model(name, out_dir)
    for name in suite.MICRO:
        for rows, hidden in suite.MICRO_SHAPES:
            export_micro(name, rows, hidden, out_dir)


if __name__ == "__main__":
    main()
