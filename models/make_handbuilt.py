#!/usr/bin/env python3
"""Build the hand-made fixtures in models/ with the `onnx` package (pip install onnx numpy).

Each graph is the shape a real exporter produces for one block, written out node by node, so
that the importer, the reference evaluator and (later) the fusion rules see every variant:

  mlp_block.onnx            MatMul+bias, erf-GELU, MatMul+bias, Dropout, residual, LayerNormalization
  layernorm_div.onnx        ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add (opset 17, axes attr)
  layernorm_reciprocal.onnx ... Sqrt -> Reciprocal -> Mul, no affine (opset 18, axes input)
  layernorm_ex2.onnx        var = E[x^2] - E[x]^2, Mul-by-reciprocal, affine (opset 17)
  rmsnorm.onnx              Llama/T5 style: Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul (opset 18)
  gelu_erf_div.onnx         x * 0.5 * (1 + erf(x / sqrt 2))
  gelu_erf_mul.onnx         0.5 * x * (1 + erf(x * (1/sqrt 2)))
  gelu_tanh.onnx            GPT-2 gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  gelu_op.onnx              the Gelu op (opset 20)
  softmax_decomposed.onnx   exp(x - max) / sum(exp(x - max)) over the last axis
  op_coverage.onnx          one graph touching the listed ops the transformer exports do not use
  cnn_block.onnx            a small image classifier: stem, pool, inverted residual block with
                            a depthwise convolution and a squeeze-and-excitation gate, global pool

Widths are awkward on purpose (the hidden size is 24, 40 or 783 wide); batch is symbolic.

    python3 models/make_handbuilt.py models/
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(20261121)


def weight(name, *shape, scale=0.1):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def scalar(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def save(out_dir, name, nodes, inputs, outputs, inits, opset):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, producer_name="fusec-handbuilt",
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = os.path.join(out_dir, f"{name}.onnx")
    onnx.save(model, path)
    print(f"{path}: {len(nodes)} nodes, opset {opset}")


def f32(name, *shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def mlp_block(out):
    d, h = 40, 96
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["fc1"], name="fc1_matmul"),
        n("Add", ["fc1", "b1"], ["fc1_bias"], name="fc1_bias"),
        n("Div", ["fc1_bias", "sqrt2"], ["g_div"], name="gelu_div"),
        n("Erf", ["g_div"], ["g_erf"], name="gelu_erf"),
        n("Add", ["g_erf", "one"], ["g_add"], name="gelu_add"),
        n("Mul", ["fc1_bias", "g_add"], ["g_mul"], name="gelu_mul"),
        n("Mul", ["g_mul", "half"], ["gelu"], name="gelu_half"),
        n("MatMul", ["gelu", "w2"], ["fc2"], name="fc2_matmul"),
        n("Add", ["fc2", "b2"], ["fc2_bias"], name="fc2_bias"),
        n("Dropout", ["fc2_bias", "ratio"], ["dropped"], name="dropout"),
        n("Add", ["dropped", "x"], ["residual"], name="residual"),
        n("LayerNormalization", ["residual", "gamma", "beta"], ["y"], name="layer_norm",
          axis=-1, epsilon=1e-5),
    ]
    inits = [weight("w1", d, h), weight("b1", h), weight("w2", h, d), weight("b2", d),
             scalar("sqrt2", np.sqrt(2.0)), scalar("one", 1.0), scalar("half", 0.5),
             scalar("ratio", 0.1), weight("gamma", d, scale=1.0), weight("beta", d)]
    save(out, "mlp_block", nodes, [f32("x", "batch", 7, d)], [f32("y", "batch", 7, d)], inits, 17)


def reduce_mean(inp, out, opset, name, axes_name="axes"):
    if opset >= 18:
        return helper.make_node("ReduceMean", [inp, axes_name], [out], name=name, keepdims=1)
    return helper.make_node("ReduceMean", [inp], [out], name=name, axes=[-1], keepdims=1)


def layernorm_div(out):
    d, opset = 24, 17
    n = helper.make_node
    nodes = [
        reduce_mean("x", "mean", opset, "mean"),
        n("Sub", ["x", "mean"], ["centered"], name="center"),
        n("Pow", ["centered", "two"], ["sq"], name="square"),
        reduce_mean("sq", "var", opset, "variance"),
        n("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        n("Sqrt", ["var_eps"], ["std"], name="std"),
        n("Div", ["centered", "std"], ["normed"], name="normalize"),
        n("Mul", ["normed", "gamma"], ["scaled"], name="scale"),
        n("Add", ["scaled", "beta"], ["y"], name="shift"),
    ]
    inits = [scalar("two", 2.0), scalar("eps", 1e-5), weight("gamma", d, scale=1.0),
             weight("beta", d)]
    save(out, "layernorm_div", nodes, [f32("x", "batch", 5, d)], [f32("y", "batch", 5, d)],
         inits, opset)


def layernorm_reciprocal(out):
    d, opset = 783, 18
    n = helper.make_node
    nodes = [
        reduce_mean("x", "mean", opset, "mean"),
        n("Sub", ["x", "mean"], ["centered"], name="center"),
        n("Mul", ["centered", "centered"], ["sq"], name="square"),
        reduce_mean("sq", "var", opset, "variance"),
        n("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        n("Sqrt", ["var_eps"], ["std"], name="std"),
        n("Reciprocal", ["std"], ["inv_std"], name="inv_std"),
        n("Mul", ["centered", "inv_std"], ["y"], name="normalize"),
    ]
    inits = [ints("axes", [-1]), scalar("eps", 1e-6)]
    save(out, "layernorm_reciprocal", nodes, [f32("x", "batch", 3, d)],
         [f32("y", "batch", 3, d)], inits, opset)


def layernorm_ex2(out):
    d, opset = 40, 17
    n = helper.make_node
    nodes = [
        reduce_mean("x", "mean", opset, "mean"),
        n("Mul", ["x", "x"], ["x_sq"], name="x_sq"),
        reduce_mean("x_sq", "mean_sq", opset, "mean_sq"),
        n("Mul", ["mean", "mean"], ["sq_mean"], name="sq_mean"),
        n("Sub", ["mean_sq", "sq_mean"], ["var"], name="variance"),
        n("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        n("Sqrt", ["var_eps"], ["std"], name="std"),
        n("Reciprocal", ["std"], ["inv_std"], name="inv_std"),
        n("Sub", ["x", "mean"], ["centered"], name="center"),
        n("Mul", ["centered", "inv_std"], ["normed"], name="normalize"),
        n("Mul", ["gamma", "normed"], ["scaled"], name="scale"),
        n("Add", ["beta", "scaled"], ["y"], name="shift"),
    ]
    inits = [scalar("eps", 1e-5), weight("gamma", d, scale=1.0), weight("beta", d)]
    save(out, "layernorm_ex2", nodes, [f32("x", "batch", 6, d)], [f32("y", "batch", 6, d)],
         inits, opset)


def rmsnorm(out):
    d, opset = 40, 18
    n = helper.make_node
    nodes = [
        n("Pow", ["x", "two"], ["sq"], name="square"),
        reduce_mean("sq", "ms", opset, "mean_square"),
        n("Add", ["ms", "eps"], ["ms_eps"], name="add_eps"),
        n("Sqrt", ["ms_eps"], ["rms"], name="rms"),
        n("Reciprocal", ["rms"], ["inv_rms"], name="inv_rms"),
        n("Mul", ["x", "inv_rms"], ["normed"], name="normalize"),
        n("Mul", ["gamma", "normed"], ["y"], name="scale"),
    ]
    inits = [ints("axes", [-1]), scalar("two", 2.0), scalar("eps", 1e-6),
             weight("gamma", d, scale=1.0)]
    save(out, "rmsnorm", nodes, [f32("x", "batch", 9, d)], [f32("y", "batch", 9, d)], inits, opset)


def gelu_variants(out):
    n = helper.make_node
    shape = ("batch", 5, 24)
    erf_div = [
        n("Div", ["x", "sqrt2"], ["d"], name="div_sqrt2"),
        n("Erf", ["d"], ["e"], name="erf"),
        n("Add", ["e", "one"], ["a"], name="add_one"),
        n("Mul", ["x", "a"], ["m"], name="mul_x"),
        n("Mul", ["m", "half"], ["y"], name="mul_half"),
    ]
    save(out, "gelu_erf_div", erf_div, [f32("x", *shape)], [f32("y", *shape)],
         [scalar("sqrt2", np.sqrt(2.0)), scalar("one", 1.0), scalar("half", 0.5)], 17)
    erf_mul = [
        n("Mul", ["x", "inv_sqrt2"], ["d"], name="mul_inv_sqrt2"),
        n("Erf", ["d"], ["e"], name="erf"),
        n("Add", ["one", "e"], ["a"], name="add_one"),
        n("Mul", ["half", "x"], ["hx"], name="half_x"),
        n("Mul", ["hx", "a"], ["y"], name="mul"),
    ]
    save(out, "gelu_erf_mul", erf_mul, [f32("x", *shape)], [f32("y", *shape)],
         [scalar("inv_sqrt2", 1 / np.sqrt(2.0)), scalar("one", 1.0), scalar("half", 0.5)], 17)
    tanh = [
        n("Pow", ["x", "three"], ["x3"], name="cube"),
        n("Mul", ["x3", "c"], ["cx3"], name="mul_c"),
        n("Add", ["x", "cx3"], ["inner"], name="add_x"),
        n("Mul", ["inner", "k"], ["scaled"], name="mul_k"),
        n("Tanh", ["scaled"], ["t"], name="tanh"),
        n("Add", ["t", "one"], ["a"], name="add_one"),
        n("Mul", ["x", "half"], ["hx"], name="half_x"),
        n("Mul", ["hx", "a"], ["y"], name="mul"),
    ]
    save(out, "gelu_tanh", tanh, [f32("x", *shape)], [f32("y", *shape)],
         [scalar("three", 3.0), scalar("c", 0.044715), scalar("k", np.sqrt(2 / np.pi)),
          scalar("one", 1.0), scalar("half", 0.5)], 17)
    save(out, "gelu_op", [n("Gelu", ["x"], ["y"], name="gelu")], [f32("x", *shape)],
         [f32("y", *shape)], [], 20)


def softmax_decomposed(out):
    n = helper.make_node
    shape = ("batch", 4, 7, 7)
    nodes = [
        n("ReduceMax", ["x"], ["mx"], name="max", axes=[-1], keepdims=1),
        n("Sub", ["x", "mx"], ["shifted"], name="shift"),
        n("Exp", ["shifted"], ["e"], name="exp"),
        n("ReduceSum", ["e", "axes"], ["s"], name="sum", keepdims=1),
        n("Div", ["e", "s"], ["y"], name="normalize"),
    ]
    save(out, "softmax_decomposed", nodes, [f32("x", *shape)], [f32("y", *shape)],
         [ints("axes", [-1])], 17)


def op_coverage(out):
    """Ops from the supported list that the transformer fixtures do not contain."""
    n = helper.make_node
    nodes = [
        n("Abs", ["x"], ["abs"]), n("Log", ["abs"], ["log"]), n("Exp", ["log"], ["exp"]),
        n("Relu", ["x"], ["relu"]), n("Sigmoid", ["x"], ["sig"]), n("Neg", ["x"], ["neg"]),
        n("Sin", ["x"], ["sin"]), n("Cos", ["x"], ["cos"]), n("Tanh", ["x"], ["tanh"]),
        n("Sqrt", ["exp"], ["sqrt"]), n("Reciprocal", ["sig"], ["recip"]),
        n("Clip", ["x", "lo", "hi"], ["clip"]), n("Min", ["sin", "cos"], ["min"]),
        n("Max", ["sin", "cos", "tanh"], ["max"]), n("Sub", ["min", "max"], ["sub"]),
        n("Less", ["x", "relu"], ["less"]), n("Greater", ["x", "neg"], ["greater"]),
        n("LessOrEqual", ["sin", "cos"], ["le"]), n("GreaterOrEqual", ["sin", "cos"], ["ge"]),
        n("Not", ["less"], ["not"]), n("And", ["not", "greater"], ["and"]),
        n("Equal", ["relu", "x"], ["eq"]),
        n("Where", ["and", "clip", "sub"], ["w0"]), n("Where", ["eq", "w0", "recip"], ["w"]),
        n("IsNaN", ["log"], ["isnan"]), n("Cast", ["isnan"], ["nan_f"], to=TensorProto.FLOAT),
        n("Add", ["w", "nan_f"], ["w1"]), n("Mul", ["w1", "sqrt"], ["w2"]),
        n("ReduceSum", ["w2", "axes_last"], ["rsum"], keepdims=0),
        n("ReduceMax", ["w2"], ["rmax"], axes=[1], keepdims=1),
        n("LogSoftmax", ["w2"], ["lsm"], axis=-1),
        n("Softmax", ["w2"], ["sm"], axis=1),
        n("CumSum", ["sm", "axis1"], ["cs"]),
        n("CumSum", ["sm", "axis2"], ["csr"], exclusive=1, reverse=1),
        n("Trilu", ["csr"], ["tril"], upper=0),
        n("Trilu", ["cs", "k1"], ["triu"], upper=1),
        n("Flatten", ["triu"], ["flat"], axis=1),
        n("Tile", ["rmax", "reps"], ["tiled"]),
        n("Split", ["lsm", "split"], ["s0", "s1"], axis=2),
        n("Concat", ["s1", "s0", "tril"], ["cat"], axis=2),
        n("Slice", ["cat", "starts", "ends", "axes_s", "steps"], ["sl"]),
        n("Gemm", ["flat", "gw", "gb"], ["gemm"], alpha=0.5, beta=2.0, transB=1),
        n("GatherElements", ["w2", "gidx"], ["ge_out"], axis=2),
        n("Pow", ["sig", "w2"], ["pow"]),
        n("Identity", ["pow"], ["ident"]),
    ]
    r, c = 3, 11
    inits = [scalar("lo", -0.5), scalar("hi", 0.7), ints("axes_last", [-1]),
             ints("axis1", 1), ints("axis2", 2), ints("k1", 1), ints("reps", [1, 1, 5]),
             ints("split", [4, 7]), ints("starts", [0, 1]), ints("ends", [9223372036854775807, -1]),
             ints("axes_s", [1, 2]), ints("steps", [2, 3]),
             weight("gw", 6, r * c), weight("gb", 6),
             numpy_helper.from_array(RNG.integers(-c, c, size=(2, r, 4)).astype(np.int64), "gidx")]
    outs = [f32("rsum", 2, r), f32("tiled", 2, 1, 5 * c), f32("sl", 2, 2, 7), f32("gemm", 2, 6),
            f32("ge_out", 2, r, 4), f32("ident", 2, r, c)]
    save(out, "op_coverage", nodes, [f32("x", 2, r, c)], outs, inits, 17)


def attention_d64(out):
    """Scaled-dot-product attention at BERT-base head size (64) with an additive causal mask
    and 77 keys: more than two shared-memory tiles, the last one partial."""
    n = helper.make_node
    heads, seq, d = 12, 77, 64
    mask = np.triu(np.full((seq, seq), -10000.0, dtype=np.float32), k=1)
    nodes = [
        n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["scores"], name="scores"),
        n("Div", ["scores", "scale"], ["scaled"], name="scaled"),
        n("Add", ["scaled", "mask"], ["masked"], name="masked"),
        n("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "v"], ["y"], name="context"),
    ]
    inits = [scalar("scale", 8.0), numpy_helper.from_array(mask, "mask")]
    shape = ("batch", heads, seq, d)
    save(out, "attention_d64", nodes, [f32("q", *shape), f32("k", *shape), f32("v", *shape)],
         [f32("y", *shape)], inits, 17)


def attention_gqa_d80(out):
    """Attention at awkward sizes: head size 80 (padded to a multiple of 16 on tensor cores),
    197 queries and keys (a ViT's token count: partial tiles), an additive padding mask input of
    shape [batch, 1, 1, keys], and grouped-query heads: 2 key/value heads shared by 6 query
    heads through Unsqueeze → Expand → Reshape, the layout exporters write."""
    n = helper.make_node
    heads, kv_heads, seq, d = 6, 2, 197, 80
    group = heads // kv_heads
    nodes = []
    for name in ("k", "v"):
        nodes += [
            n("Unsqueeze", [name, "axis2"], [f"{name}5"], name=f"{name}_unsqueeze"),
            n("Expand", [f"{name}5", "expanded"], [f"{name}x"], name=f"{name}_expand"),
            n("Reshape", [f"{name}x", "heads_shape"], [f"{name}h"], name=f"{name}_heads"),
        ]
    nodes += [
        n("Transpose", ["kh"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kt"], ["scores"], name="scores"),
        n("Mul", ["scores", "scale"], ["scaled"], name="scaled"),
        n("Add", ["scaled", "mask"], ["masked"], name="masked"),
        n("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "vh"], ["y"], name="context"),
    ]
    inits = [
        scalar("scale", 1.0 / np.sqrt(d)),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1, kv_heads, group, seq, d], dtype=np.int64), "expanded"),
        numpy_helper.from_array(np.array([0, heads, seq, d], dtype=np.int64), "heads_shape"),
    ]
    inputs = [f32("q", "batch", heads, seq, d), f32("k", "batch", kv_heads, seq, d),
              f32("v", "batch", kv_heads, seq, d), f32("mask", "batch", 1, 1, seq)]
    save(out, "attention_gqa_d80", nodes, inputs, [f32("y", "batch", heads, seq, d)], inits, 17)


def cnn_block(out):
    """A small image classifier in the shapes torchvision's exports take (TorchScript, opset
    17) at awkward sizes: a 29×23 image, a strided stem with BatchNormalization and ReLU, a
    ceil-mode max pool, an inverted residual block (1×1 expansion with HardSwish, a 7×7
    depthwise convolution with SiLU, a squeeze-and-excitation gate with HardSigmoid, a 1×1
    projection, the residual add), a strided 3×3 depthwise convolution of 24 channels, global
    average pooling, Flatten and the classifier's Gemm."""
    rng = np.random.default_rng(20261124)
    n = helper.make_node

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    def bn(name, c):
        return [numpy_helper.from_array(a.astype(np.float32), f"{name}_{k}") for k, a in (
            ("scale", rng.uniform(0.5, 1.5, c)), ("bias", rng.uniform(-0.3, 0.3, c)),
            ("mean", rng.uniform(-0.2, 0.2, c)), ("var", rng.uniform(0.3, 1.5, c)))]

    def bn_node(x, name, y):
        return n("BatchNormalization", [x] + [f"{name}_{k}" for k in ("scale", "bias", "mean", "var")],
                 [y], name=name, epsilon=1e-5)

    nodes = [
        n("Conv", ["x", "stem_w"], ["stem"], name="stem", pads=[1, 1, 1, 1], strides=[2, 2]),
        bn_node("stem", "stem_bn", "stem_n"), n("Relu", ["stem_n"], ["stem_r"]),
        n("MaxPool", ["stem_r"], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
          ceil_mode=1),
        n("Conv", ["pool", "expand_w", "expand_b"], ["expand"], name="expand"),
        n("HardSwish", ["expand"], ["expand_a"]),
        n("Conv", ["expand_a", "dw_w"], ["dw"], name="depthwise", pads=[3, 3, 3, 3], group=32),
        bn_node("dw", "dw_bn", "dw_n"), n("Sigmoid", ["dw_n"], ["dw_s"]),
        n("Mul", ["dw_n", "dw_s"], ["dw_a"]),
        n("GlobalAveragePool", ["dw_a"], ["se_pool"]),
        n("Conv", ["se_pool", "se1_w", "se1_b"], ["se1"], name="se_reduce"),
        n("Relu", ["se1"], ["se1_r"]),
        n("Conv", ["se1_r", "se2_w", "se2_b"], ["se2"], name="se_expand"),
        n("HardSigmoid", ["se2"], ["gate"], alpha=1.0 / 6.0, beta=0.5),
        n("Mul", ["dw_a", "gate"], ["gated"]),
        n("Conv", ["gated", "project_w"], ["project"], name="project"),
        bn_node("project", "project_bn", "project_n"),
        n("Add", ["project_n", "pool"], ["block"]),
        n("Conv", ["block", "widen_w", "widen_b"], ["widen"], name="widen"),
        n("Conv", ["widen", "dw2_w", "dw2_b"], ["dw2"], name="depthwise_strided", pads=[1, 1, 1, 1],
          strides=[2, 2], group=24),
        n("Relu", ["dw2"], ["dw2_r"]),
        n("GlobalAveragePool", ["dw2_r"], ["gap"]),
        n("Flatten", ["gap"], ["flat"], axis=1),
        n("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="classifier", transB=1),
    ]
    inits = [w("stem_w", 16, 3, 3, 3), w("expand_w", 32, 16, 1, 1), w("expand_b", 32),
             w("dw_w", 32, 1, 7, 7), w("se1_w", 8, 32, 1, 1), w("se1_b", 8),
             w("se2_w", 32, 8, 1, 1), w("se2_b", 32), w("project_w", 16, 32, 1, 1),
             w("widen_w", 24, 16, 1, 1), w("widen_b", 24), w("dw2_w", 24, 1, 3, 3), w("dw2_b", 24),
             w("fc_w", 10, 24), w("fc_b", 10)]
    inits += bn("stem_bn", 16) + bn("dw_bn", 32) + bn("project_bn", 16)
    save(out, "cnn_block", nodes, [f32("x", "batch", 3, 29, 23)], [f32("y", "batch", 10)], inits, 17)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for build in (mlp_block, layernorm_div, layernorm_reciprocal, layernorm_ex2, rmsnorm,
                  gelu_variants, softmax_decomposed, op_coverage, attention_d64,
                  attention_gqa_d80, cnn_block):
        build(out)


if __name__ == "__main__":
    main()
