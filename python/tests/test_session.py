"""`fusec.Session` on a GPU: NumPy in and out, PyTorch CUDA tensors in and out without a copy."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import fusec
from conftest import MODELS, feed_for, gpu, rel_l2

pytestmark = gpu


def reference(path, feed):
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


@pytest.fixture(scope="module")
def bert():
    path = MODELS / "bert_mask_ts.onnx"
    return path, fusec.Session(fusec.compile(path, dims={"batch": (1, 8), "seq": (1, 64)}))


def test_numpy_in_and_out(bert):
    path, session = bert
    for batch, seq in [(3, 13), (1, 64), (8, 5)]:
        feed = feed_for(path, seed=seq, dims={"batch": batch, "seq": seq})
        (got,) = session.run(["last_hidden_state"], feed)
        (want,) = reference(path, feed)[:1]
        assert got.shape == (batch, seq, 64) and rel_l2(got, want) <= 1e-5
    # Each run's outputs are arrays of their own (writable, their memory not the session's):
    # a later run leaves them as they were.
    first = feed_for(path, seed=21, dims={"batch": 2, "seq": 9})
    (kept,) = session.run(["last_hidden_state"], first)
    copy = kept.copy()
    (later,) = session.run(["last_hidden_state"], feed_for(path, seed=22, dims={"batch": 2, "seq": 9}))
    assert kept.flags.writeable and not np.shares_memory(kept, later)
    assert np.array_equal(kept, copy) and not np.array_equal(kept, later)
    # Non-contiguous and list inputs are taken as NumPy takes them.
    feed = feed_for(path, seed=1, dims={"batch": 2, "seq": 9})
    strided = {k: np.asfortranarray(v) for k, v in feed.items()}
    assert np.array_equal(session.run(None, strided)[0], session.run(None, feed)[0])


def test_bad_inputs_name_the_input(bert):
    path, session = bert
    feed = feed_for(path, dims={"batch": 2, "seq": 9})
    with pytest.raises(fusec.InputError, match="input 'attention_mask' is f32"):
        session.run(None, {**feed, "attention_mask": feed["attention_mask"].astype(np.float32)})
    with pytest.raises(fusec.InputError, match="seq must be in 1..64"):
        session.run(None, feed_for(path, dims={"batch": 2, "seq": 65}))
    with pytest.raises(fusec.InputError, match="no output 'logits'"):
        session.run(["logits"], feed)


def test_a_token_id_past_the_vocabulary_fails_the_run(bert):
    path, session = bert
    feed = feed_for(path, seed=5, dims={"batch": 2, "seq": 9})
    (want,) = session.run(["last_hidden_state"], feed)
    for bad in (512, 10**9, -513):
        ids = feed["input_ids"].copy()
        ids[1, 4] = bad
        with pytest.raises(fusec.InputError, match=rf"index out of range: Gather node .*'input_ids' lies outside axis 0 .*: it read {bad};"):
            session.run(None, {**feed, "input_ids": ids})
    # The session runs on, and right.
    (got,) = session.run(["last_hidden_state"], feed)
    assert np.array_equal(got, want)


def test_torch_tensors_in_and_out_without_a_copy(bert):
    torch = pytest.importorskip("torch")
    path, session = bert
    feed = feed_for(path, seed=3, dims={"batch": 4, "seq": 20})
    want = session.run(None, feed)
    on_gpu = {k: torch.from_numpy(v).cuda() for k, v in feed.items()}
    out = session.run_torch(on_gpu)
    for (name, tensor), w in zip(out.items(), want):
        assert tensor.is_cuda and tensor.data_ptr() == session.output_address(name)
        assert np.array_equal(tensor.cpu().numpy(), w)
    # Inputs written in the session's own buffers are read in place.
    bound = {}
    for name, value in on_gpu.items():
        buffer = session.input_tensor(name, value.shape)
        assert buffer.data_ptr() == session.input_address(name)
        buffer.copy_(value)
        bound[name] = buffer
    again = session.run_torch(bound)
    assert torch.equal(again["last_hidden_state"], torch.from_numpy(want[0]).cuda())


def test_torch_ordering_follows_the_callers_stream(bert):
    torch = pytest.importorskip("torch")
    path, session = bert
    feed = feed_for(path, seed=5, dims={"batch": 8, "seq": 64})
    want = session.run(None, feed)[0]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # Work queued on the stream before the run: a slow product, then the inputs.
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(4):
            big = big @ big / 64
        inputs = {k: torch.from_numpy(v).pin_memory().cuda(non_blocking=True) for k, v in feed.items()}
        out = session.run_torch(inputs, stream=stream)["last_hidden_state"]
        copy = out.clone()
    stream.synchronize()
    assert torch.equal(copy.cpu(), torch.from_numpy(want))


def test_run_torch_refuses_host_tensors(bert):
    torch = pytest.importorskip("torch")
    path, session = bert
    feed = {k: torch.from_numpy(v) for k, v in feed_for(path, dims={"batch": 2, "seq": 9}).items()}
    with pytest.raises(fusec.InputError, match="is on cpu: run_torch takes CUDA tensors"):
        session.run_torch(feed)


def test_a_session_loads_a_bundle_file(tmp_path):
    path = tmp_path / "mlp.bundle"
    fusec.compile(MODELS / "mlp_block.onnx", path, dims={"batch": 3})
    session = fusec.Session(path)
    feed = feed_for(MODELS / "mlp_block.onnx")
    assert rel_l2(session.run(None, feed)[0], reference(MODELS / "mlp_block.onnx", feed)[0]) <= 1e-5
    assert "mlp_block" in repr(session)


def test_any_dlpack_producer_and_consumer(bert):
    torch = pytest.importorskip("torch")
    path, session = bert
    feed = feed_for(path, seed=9, dims={"batch": 2, "seq": 33})
    want = session.run(None, feed)[0]
    out = session.run_dlpack({k: torch.from_numpy(v).cuda() for k, v in feed.items()})
    tensor = out["last_hidden_state"]
    assert tensor.shape == (2, 33, 64) and tensor.__dlpack_device__() == (2, 0)
    viewed = torch.from_dlpack(tensor)
    assert viewed.data_ptr() == tensor.data_ptr == session.output_address("last_hidden_state")
    assert np.array_equal(viewed.cpu().numpy(), want)
    strided = torch.from_numpy(feed["input_ids"]).cuda().t()
    with pytest.raises(fusec.InputError, match="input 'input_ids' has strides"):
        session.run_dlpack({**{k: torch.from_numpy(v).cuda() for k, v in feed.items()}, "input_ids": strided})
    with pytest.raises(fusec.InputError, match="has no __dlpack__"):
        session.run_dlpack({k: v.tolist() for k, v in feed.items()})


def test_a_tensor_that_outlives_the_interpreter_ends_quietly():
    pytest.importorskip("torch")
    import subprocess
    import sys

    # The tensor is a global: PyTorch frees it (and calls fusec's deleter) while the interpreter
    # shuts down.
    code = (
        "import fusec, torch\n"
        f"s = fusec.Session(fusec.compile({str(MODELS / 'mlp_block.onnx')!r}, dims={{'batch': 3}}))\n"
        "t = s.input_tensor('x')\n"
        "print(tuple(t.shape))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "panicked" not in done.stderr, done.stderr
    assert done.stdout.strip() == "(3, 7, 40)"
