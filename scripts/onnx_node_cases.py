#!/usr/bin/env python3
"""Write the ONNX backend node test cases for the ops fusec supports, in the usual layout:

    OUT/<case>/model.onnx
    OUT/<case>/test_data_set_N/input_K.pb, output_K.pb
    OUT/<case>/tolerance.json        {"rtol": ..., "atol": ...} from the case definition

The cases come from the `onnx` package's own definitions
(`onnx.backend.test.case.node.collect_testcases`). Needs `pip install onnx numpy`.

    python3 scripts/onnx_node_cases.py OUT_DIR
"""

import json
import os
import sys
import warnings

import numpy as np
from onnx import numpy_helper, save
from onnx.backend.test.case.node import collect_testcases

SUPPORTED = set("""
Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu Gelu Neg Abs Sin Cos Clip Min
Max Where Equal Less LessOrEqual Greater GreaterOrEqual Not And IsNaN Cast MatMul Gemm Conv
Softmax LogSoftmax LayerNormalization ReduceMean ReduceSum ReduceMax Dropout Identity Constant
Reshape Transpose Squeeze Unsqueeze Flatten Concat Split Slice Gather GatherElements GatherND Expand
Tile
Shape Size ConstantOfShape Range Trilu CumSum
MaxPool AveragePool GlobalAveragePool GlobalMaxPool BatchNormalization HardSigmoid HardSwish
Softplus Mish DepthToSpace SpaceToDepth Pad InstanceNormalization GroupNormalization
LpNormalization ReduceL1 ReduceL2 ReduceSumSquare Mod Resize Upsample ConvTranspose
LeakyRelu PRelu Elu Selu Celu ThresholdedRelu Softsign Shrink
""".split())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    warnings.simplefilter("ignore")
    written = 0
    for case in collect_testcases(None):
        graph = case.model.graph
        if case.model.functions or any(n.domain not in ("", "ai.onnx") for n in graph.node):
            continue
        if not {n.op_type for n in graph.node} <= SUPPORTED:
            continue
        sets = [(i, o) for i, o in case.data_sets
                if all(isinstance(t, np.ndarray) for t in list(i) + list(o))]
        if not sets:
            continue
        case_dir = os.path.join(out, case.name)
        os.makedirs(case_dir, exist_ok=True)
        save(case.model, os.path.join(case_dir, "model.onnx"))
        for n, (inputs, outputs) in enumerate(sets):
            data_dir = os.path.join(case_dir, f"test_data_set_{n}")
            os.makedirs(data_dir, exist_ok=True)
            for k, (value, info) in enumerate(zip(inputs, graph.input)):
                with open(os.path.join(data_dir, f"input_{k}.pb"), "wb") as f:
                    f.write(numpy_helper.from_array(value, info.name).SerializeToString())
            for k, (value, info) in enumerate(zip(outputs, graph.output)):
                with open(os.path.join(data_dir, f"output_{k}.pb"), "wb") as f:
                    f.write(numpy_helper.from_array(value, info.name).SerializeToString())
        with open(os.path.join(case_dir, "tolerance.json"), "w") as f:
            json.dump({"rtol": case.rtol, "atol": case.atol}, f)
        written += 1
    print(f"{written} node test cases written to {out}")


if __name__ == "__main__":
    main()
