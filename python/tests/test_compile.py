"""What a machine without a GPU can do: compile, inspect, bundles in and out, errors."""

from __future__ import annotations

import logging

import pytest

import fusec
from conftest import MODELS


def test_the_package_imports_and_says_what_it_finds():
    assert isinstance(fusec.cuda_available(), bool)
    assert isinstance(fusec.nvrtc_available(), bool)
    assert fusec.__version__.count(".") == 2


def test_compile_gives_a_bundle_that_describes_itself(caplog):
    with caplog.at_level(logging.INFO, logger="fusec"):
        bundle = fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2, "seq": 16})
    info = bundle.info
    assert info["fused"] and info["precision"] == "f32"
    assert 0 < info["kernels"] <= info["launches"]
    assert info["graph_breaks"] == 0 and info["weight_bytes"] > 0 and info["arena_bytes"] > 0
    assert bundle.inputs == [{"name": "input", "dtype": "int64", "shape": [2, 16], "inside": None}]
    assert bundle.outputs == [
        {"name": "last_hidden_state", "dtype": "float32", "shape": [2, 16, 64], "inside": None}
    ]
    assert bundle.ranges == []
    stages = [r.getMessage().split(":")[0] for r in caplog.records]
    assert {"import", "passes", "fuse", "plan", "codegen"} <= set(stages)
    unfused = fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2, "seq": 16}, fuse=False)
    assert not unfused.info["fused"] and unfused.info["launches"] > info["launches"]


def test_a_range_bundle_names_its_dims():
    bundle = fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": (1, 4), "seq": (1, 32)}, precision="fp16")
    assert bundle.ranges == [("batch", (1, 4)), ("seq", (1, 32))]
    assert bundle.inputs[0]["shape"] == ["batch", "seq"]
    assert bundle.outputs[0]["shape"] == ["batch", "seq", 64]
    assert bundle.info["precision"] == "f16"
    assert "batch=1..4" in repr(bundle)


def test_a_networks_convolutions_on_cudnn_are_counted():
    # cnn_block's convolutions on cuDNN, for one batch and for a range of batches alike; a
    # transformer has none.
    for dims in ({"batch": 2}, {"batch": (1, 8)}):
        bundle = fusec.compile(MODELS / "cnn_block.onnx", dims=dims)
        assert bundle.info["conv_calls"] > 0, dims
    assert fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2, "seq": 16}).info["conv_calls"] == 0


def test_exact_gelu_keeps_erf_in_an_epilogue_kernel():
    # The tiny BERT's two erf-GELUs after their GEMMs: cuBLASLt's tanh form by default in fp16
    # (one launch a GEMM), an epilogue kernel each with exact_gelu.
    dims = {"batch": 2, "seq": 16}
    tanh = fusec.compile(MODELS / "bert_ts.onnx", dims=dims, precision="fp16")
    exact = fusec.compile(MODELS / "bert_ts.onnx", dims=dims, precision="fp16", exact_gelu=True)
    assert exact.info["kernels"] == tanh.info["kernels"]
    assert exact.info["launches"] == tanh.info["launches"] + 2


def test_bundles_round_trip_through_files_and_bytes(tmp_path):
    path = tmp_path / "gpt2.bundle"
    bundle = fusec.compile(MODELS / "gpt2_ts.onnx", path, dims={"batch": 1, "seq": 7})
    loaded = fusec.Bundle.load(path)
    assert loaded == bundle
    assert loaded.to_bytes() == path.read_bytes()
    assert fusec.Bundle.from_bytes(bundle.to_bytes()) == bundle
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(fusec.BundleError, match="checksum|damaged|corrupt"):
        fusec.Bundle.from_bytes(bytes(damaged))
    with pytest.raises(fusec.BundleError, match="not a fusec bundle"):
        fusec.Bundle.from_bytes(b"hello" * 20)


def test_compile_errors_name_the_file_and_what_is_wrong(tmp_path):
    with pytest.raises(fusec.CompileError, match="missing.onnx"):
        fusec.compile(tmp_path / "missing.onnx")
    with pytest.raises(fusec.CompileError, match="seq"):
        fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2})
    with pytest.raises(fusec.InputError, match="precision 'fp8'"):
        fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2, "seq": 4}, precision="fp8")
    with pytest.raises(fusec.InputError, match="dims\\['seq'\\]"):
        fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2, "seq": "long"})
    assert issubclass(fusec.CompileError, fusec.Error) and issubclass(fusec.Error, Exception)


def test_a_dim_can_be_the_sum_of_two():
    dims = {"batch": 1, "seq": 1, "past": 7, "total": "past+seq"}
    bundle = fusec.compile(MODELS / "gpt2_cache_ts.onnx", dims=dims)
    shapes = {i["name"]: i["shape"] for i in bundle.inputs}
    assert shapes["attention_mask"] == [1, 8] and shapes["past_key_values.0.key"] == [1, 4, 7, 16]
    # A part given a range makes the sum a range of its own, read from no input.
    ranged = fusec.compile(MODELS / "gpt2_cache_ts.onnx", dims={**dims, "past": (0, 7)})
    assert dict(ranged.ranges) == {"past": (0, 7), "total": (1, 8)}
    with pytest.raises(fusec.InputError, match="give past a size"):
        fusec.compile(MODELS / "gpt2_cache_ts.onnx", dims={"batch": 1, "seq": 1, "total": "past+seq"})
    # Not given beside `past` and `seq`, the mask's length is inferred as their sum.
    inferred = fusec.compile(MODELS / "gpt2_cache_ts.onnx", dims={"batch": 1, "seq": 1, "past": (0, 7)})
    assert dict(inferred.ranges) == {"past": (0, 7), "total": (1, 8)}


def test_a_cache_in_place_is_stored_inside_its_output():
    dims = {"batch": 2, "seq": 1, "past": 5, "total": "past+seq"}
    plain = fusec.compile(MODELS / "gpt2_cache_ts.onnx", dims=dims, precision="fp16")
    bundle = fusec.compile(MODELS / "gpt2_cache_ts.onnx", dims=dims, precision="fp16", cache_in_place=True)
    inputs = {i["name"]: i for i in bundle.inputs}
    for layer in (0, 1):
        for kind in ("key", "value"):
            cache = inputs[f"past_key_values.{layer}.{kind}"]
            # Inside its present, in the storage type; copied in and out in f32 without.
            assert cache["inside"] == f"present.{layer}.{kind}" and cache["dtype"] == "float16"
            assert cache["shape"] == [2, 4, 5, 16]
            before = next(i for i in plain.inputs if i["name"] == cache["name"])
            assert before["inside"] is None and before["dtype"] == "float32"
    assert inputs["input_ids"]["inside"] is None
    outputs = {o["name"]: o for o in bundle.outputs}
    assert outputs["present.0.key"]["dtype"] == "float16" and outputs["present.0.key"]["shape"] == [2, 4, 6, 16]
    # No cache converted or concatenated: fewer kernels (a layer's appends one), less memory.
    assert bundle.info["kernels"] < plain.info["kernels"]
    assert bundle.info["arena_bytes"] < plain.info["arena_bytes"]


def test_inputs_given_by_shape_compile_without_dims():
    bundle = fusec.compile(MODELS / "mlp_block.onnx", inputs={"x": (5, 7, 40)})
    assert bundle.inputs == [{"name": "x", "dtype": "float32", "shape": [5, 7, 40], "inside": None}]


def test_summarize_reads_what_the_file_declares():
    summary = fusec.summarize(MODELS / "gpt2_cache_ts.onnx")
    names = [i["name"] for i in summary["inputs"]]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert summary["inputs"][3]["shape"] == ["batch", 4, "past", 16]
    assert summary["outputs"][0]["name"] == "logits" and summary["unsupported"] == []


@pytest.mark.skipif(fusec.cuda_available(), reason="checks the error a machine without a GPU gives")
def test_a_session_without_a_gpu_is_a_clear_error():
    bundle = fusec.compile(MODELS / "bert_ts.onnx", dims={"batch": 2, "seq": 16})
    with pytest.raises(fusec.DeviceError, match="no CUDA driver"):
        fusec.Session(bundle)
