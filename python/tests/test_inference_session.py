"""`fusec.InferenceSession` against ONNX Runtime's CPU provider: the same metadata on every
fixture; on a GPU, the same outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest

import fusec
from conftest import MODELS, feed_for, gpu, model_paths, rel_l2


def reference(path, feed):
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


@pytest.mark.parametrize("path", model_paths(), ids=lambda p: p.stem)
def test_inputs_and_outputs_are_onnx_runtimes(path):
    ours = fusec.InferenceSession(path)
    theirs = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(a.name, a.type, a.shape) for a in ours.get_inputs()] == [
        (a.name, a.type, a.shape) for a in theirs.get_inputs()
    ]
    mine, ort = ours.get_outputs(), theirs.get_outputs()
    assert [(a.name, a.type, len(a.shape)) for a in mine] == [(a.name, a.type, len(a.shape)) for a in ort]
    for a, b in zip(mine, ort):
        # Every dim ONNX Runtime fixes, fusec fixes the same; fusec's inference (tract's) may
        # also fix one that ONNX Runtime leaves named (gpt2_ts's hidden size), never the
        # other way round.
        for m, o in zip(a.shape, b.shape):
            assert m == o or (isinstance(o, str) and isinstance(m, int)), (a.name, a.shape, b.shape)


def test_there_are_fixtures():
    assert len(model_paths()) >= 20, f"models in {MODELS}"


def test_a_bad_feed_names_the_input():
    session = fusec.InferenceSession(str(MODELS / "bert_mask_ts.onnx"))
    feed = feed_for(MODELS / "bert_mask_ts.onnx")
    with pytest.raises(fusec.InputError, match="'input_id' is not an input .*input_ids"):
        session.run(None, {**feed, "input_id": feed["input_ids"]})
    with pytest.raises(fusec.InputError, match="input 'token_type_ids' was not given"):
        session.run(None, {k: v for k, v in feed.items() if k != "token_type_ids"})
    with pytest.raises(fusec.InputError, match="input 'attention_mask' is float32, the model takes int64"):
        session.run(None, {**feed, "attention_mask": feed["attention_mask"].astype(np.float32)})
    with pytest.raises(fusec.InputError, match=r"input 'input_ids' has shape \[39\]"):
        session.run(None, {**feed, "input_ids": feed["input_ids"].reshape(-1)})
    fixed = fusec.InferenceSession(MODELS / "attention_d64.onnx")
    q = np.ones((1, 12, 76, 64), np.float32)
    with pytest.raises(fusec.InputError, match=r"input 'q' has shape \[1, 12, 76, 64\]"):
        fixed.run(None, {"q": q, "k": q, "v": q})


def test_unsupported_ops_are_named_at_construction(tmp_path):
    node = onnx.helper.make_node("Frobnicate", ["x"], ["y"], name="the_node", domain="com.example")
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    path = tmp_path / "odd.onnx"
    onnx.save(model, path)
    with pytest.raises(fusec.CompileError, match="the_node \\(Frobnicate\\)"):
        fusec.InferenceSession(path)


def test_model_bytes_are_accepted():
    session = fusec.InferenceSession((MODELS / "mlp_block.onnx").read_bytes())
    assert [i.name for i in session.get_inputs()] == ["x"]


@pytest.mark.skipif(fusec.cuda_available(), reason="checks the error a machine without a GPU gives")
def test_running_without_a_gpu_is_a_clear_error():
    session = fusec.InferenceSession(MODELS / "mlp_block.onnx")
    with pytest.raises(fusec.DeviceError, match="no CUDA driver"):
        session.run(None, feed_for(MODELS / "mlp_block.onnx"))


@gpu
@pytest.mark.parametrize("path", model_paths(), ids=lambda p: p.stem)
def test_outputs_match_onnx_runtime(path):
    feed = feed_for(path, seed=7)
    want = reference(path, feed)
    session = fusec.InferenceSession(path)
    got = session.run(None, feed)
    assert len(got) == len(want)
    for g, w, arg in zip(got, want, session.get_outputs()):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert all(isinstance(d, str) or d == n for d, n in zip(arg.shape, g.shape)), (arg, g.shape)
        assert rel_l2(g, w) <= 1e-5, f"{path.stem}: rel-L2 {rel_l2(g, w):.2e}"


@gpu
def test_one_range_session_serves_every_shape():
    path = MODELS / "bert_mask_ts.onnx"
    session = fusec.InferenceSession(path, dims={"batch": (1, 8), "seq": (1, 64)})
    for batch, seq in [(1, 1), (3, 13), (8, 64), (2, 37), (3, 13)]:
        feed = feed_for(path, seed=batch * seq, dims={"batch": batch, "seq": seq})
        for g, w in zip(session.run(None, feed), reference(path, feed)):
            assert g.shape == w.shape and rel_l2(g, w) <= 1e-5, (batch, seq, rel_l2(g, w))
    assert len(session._sessions) == 1


DECODER = MODELS / "gpt2_cache_ts.onnx"
# A decoder's loop: the prompt with nothing cached, then one token a step over a growing cache.
LOOP_DIMS = [
    {"batch": 2, "seq": (1, 16), "past": 0, "total": "past+seq"},
    {"batch": (1, 4), "seq": 1, "past": (0, 300), "total": "past+seq"},
]


def step_feed(tokens, past, cache):
    """A step of `tokens` (a row a sequence) after `past` cached positions, the cache `cache`
    (empty arrays where nothing is cached)."""
    batch, seq = tokens.shape
    feed = {
        "input_ids": tokens.astype(np.int64),
        "attention_mask": np.ones((batch, past + seq), np.int64),
        "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1)),
    }
    for i in range(4):
        name = f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}"
        feed[name] = cache[i] if cache else np.zeros((batch, 4, 0, 16), np.float32)
    return feed


def test_each_run_goes_to_the_first_dims_its_sizes_fit():
    session = fusec.InferenceSession(DECODER, dims=LOOP_DIMS)
    prompt = session._check(step_feed(np.ones((2, 7)), 0, None))
    assert session._dims_for(prompt) == 0
    cache = [np.zeros((2, 4, 7, 16), np.float32)] * 4
    step = session._check(step_feed(np.ones((2, 1)), 7, cache))
    assert session._dims_for(step) == 1
    # A prompt after a cache fits neither: the error names the sizes.
    with pytest.raises(fusec.InputError, match="fit none of dims"):
        session._dims_for(session._check(step_feed(np.ones((2, 3)), 7, cache)))
    # One mapping: its bundle says why a feed is outside it.
    assert fusec.InferenceSession(DECODER, dims=LOOP_DIMS[1])._dims_for(prompt) == 0


@gpu
def test_a_decoding_loop_compiles_two_bundles_and_matches_onnx_runtime():
    session = fusec.InferenceSession(DECODER, dims=LOOP_DIMS)
    ort = onnxruntime.InferenceSession(str(DECODER), providers=["CPUExecutionProvider"])
    tokens = np.array([[5, 17, 301, 42, 9, 77, 3], [11, 480, 2, 64, 128, 6, 90]], np.int64)
    ours = theirs = None
    for n in range(10):
        past = 0 if n == 0 else tokens.shape[1] - 1
        new = tokens if n == 0 else tokens[:, -1:]
        got = session.run(None, step_feed(new, past, ours))
        want = ort.run(None, step_feed(new, past, theirs))
        assert rel_l2(got[0], want[0]) <= 1e-5, (n, rel_l2(got[0], want[0]))
        pick = got[0][:, -1].argmax(-1)
        assert (pick == want[0][:, -1].argmax(-1)).all(), n
        tokens = np.concatenate([tokens, pick[:, None].astype(np.int64)], axis=1)
        ours, theirs = got[1:], want[1:]
    assert len(session._sessions) == 2
