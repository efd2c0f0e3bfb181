"""`fusec.Generator`: the decoding loop of `fusec generate` from Python — on the CPU (tract)
everywhere, on a GPU where there is one — against ONNX Runtime recomputing every prefix."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import fusec
from conftest import MODELS, gpu

DECODERS = ["gpt2_cache_ts.onnx", "llama_cache_ts.onnx", "gpt2_cache_dynamo.onnx", "llama_cache_dynamo.onnx"]
PROMPTS = [[5, 77, 300], [11, 2, 480, 9, 160]]


def greedy_by_recomputing(path, prompt, new):
    """Greedy tokens after `prompt`, each from ONNX Runtime's pass over the whole prefix (an
    empty cache), no cache carried between steps."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    empty = {i["name"]: np.zeros((1, i["shape"][1], 0, i["shape"][3]), np.float32)
             for i in fusec.summarize(str(path))["inputs"] if i["name"].startswith("past")}
    ids = list(prompt)
    for _ in range(new):
        n = len(ids)
        feed = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, n), np.int64),
                "position_ids": np.arange(n, dtype=np.int64)[None], **empty}
        logits = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("model", DECODERS)
def test_greedy_tokens_on_the_cpu_match_recomputing(model):
    path = MODELS / model
    generator = fusec.Generator(path, batch=2, capacity=12, device="cpu")
    assert (generator.batch, generator.capacity, generator.vocab, generator.device) == (2, 12, 512, "cpu")
    streamed = []
    result = generator.generate(PROMPTS, max_new_tokens=6, on_token=lambda b, t: streamed.append((b, t)))
    assert result.steps == 5 + 6 - 1
    for prompt, tokens in zip(PROMPTS, result.tokens):
        assert tokens == greedy_by_recomputing(path, prompt, 6), f"{model} after {prompt}"
    # Every token streamed once, in each sequence's order.
    for b, tokens in enumerate(result.tokens):
        assert [t for s, t in streamed if s == b] == tokens
    # A stop token ends its sequence (kept); one prompt alone, as a flat list.
    stop = result.tokens[1][2]
    alone = generator.generate(PROMPTS[1], max_new_tokens=6, stop=stop)
    assert alone.tokens == [result.tokens[1][: result.tokens[1].index(stop) + 1]]


def test_a_prompt_step_gives_the_same_tokens():
    path = MODELS / DECODERS[0]
    plain = fusec.Generator(path, batch=2, capacity=12, device="cpu")
    stepped = fusec.Generator(path, batch=2, capacity=12, prompt_tokens=3, device="cpu")
    assert (plain.prompt_tokens, stepped.prompt_tokens) == (None, 3)
    want = plain.generate(PROMPTS, max_new_tokens=5).tokens
    got = stepped.generate(PROMPTS, max_new_tokens=5)
    assert got.tokens == want
    assert got.steps == 1 + (5 - 3) + 5 - 1, "the first 3 tokens of both prompts in one step"


def test_draws_follow_the_seed():
    generator = fusec.Generator(MODELS / DECODERS[1], batch=2, capacity=16, device="cpu")
    first = generator.generate(PROMPTS, max_new_tokens=8, sample="top-k=20", seed=7, temperature=1.5)
    again = generator.generate(PROMPTS, max_new_tokens=8, sample="top-k=20", seed=7, temperature=1.5)
    nucleus = generator.generate(PROMPTS, max_new_tokens=8, sample="top-p=0.9", seed=7)
    assert first.tokens == again.tokens and all(len(t) == 8 for t in first.tokens + nucleus.tokens)
    assert all(0 <= t < generator.vocab for t in sum(first.tokens + nucleus.tokens, []))


def test_bad_requests_are_input_errors():
    path = MODELS / DECODERS[0]
    generator = fusec.Generator(path, batch=1, capacity=8, device="cpu")
    with pytest.raises(fusec.InputError, match="1 to 1"):
        generator.generate(PROMPTS)
    with pytest.raises(fusec.InputError, match="outside the vocabulary of 512"):
        generator.generate([[3, 9000]])
    with pytest.raises(fusec.InputError, match="--dim past"):
        generator.generate([[3, 4]], max_new_tokens=40)
    with pytest.raises(fusec.InputError, match="top-q"):
        generator.generate([[3, 4]], sample="top-q=3")
    with pytest.raises(fusec.InputError, match="list of token ids"):
        generator.generate("not ids")
    with pytest.raises(fusec.InputError, match="cpu"):
        fusec.Generator(path, device="tpu")
    with pytest.raises(fusec.InputError, match="does not fit a cache of 8"):
        fusec.Generator(path, capacity=8, prompt_tokens=9, device="cpu")
    # A callback's exception comes back as itself.
    def boom(b, t):
        raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        generator.generate([[3, 4]], max_new_tokens=3, on_token=boom)
    # A file that is not there is a compile error naming it.
    with pytest.raises(fusec.CompileError, match="no_such_decoder.onnx"):
        fusec.Generator(MODELS / "no_such_decoder.onnx", device="cpu")
    assert repr(generator) == "Generator(batch=1, capacity=8, vocab=512, prompt_tokens=None, device=cpu)"
    # A model without a cache names what it lacks.
    with pytest.raises(fusec.Error, match="input_ids|not one a decoder"):
        fusec.Generator(MODELS / "bert_ts.onnx", device="cpu")


@gpu
@pytest.mark.parametrize("model", DECODERS)
def test_the_gpu_generates_the_cpus_tokens(model):
    path = MODELS / model
    cpu = fusec.Generator(path, batch=2, capacity=24, prompt_tokens=3, device="cpu")
    for precision in ["fp32", "fp16"]:
        generator = fusec.Generator(path, batch=2, capacity=24, prompt_tokens=3, precision=precision, device=0)
        got = generator.generate(PROMPTS, max_new_tokens=12)
        want = cpu.generate(PROMPTS, max_new_tokens=12)
        if precision == "fp32":
            assert got.tokens == want.tokens
        else:
            # fp16 logits may tie-break differently late in a sequence; the first tokens agree.
            assert [t[:4] for t in got.tokens] == [t[:4] for t in want.tokens]
        assert got.ms_per_token > 0 and got.tokens_per_second > 0
    # Drawn tokens: the GPU's draws are the CPU loop's for the same seed (fp32).
    generator = fusec.Generator(path, batch=2, capacity=24, device=0)
    for sample in ["top-k=20", "top-p=0.9"]:
        got = generator.generate(PROMPTS, max_new_tokens=10, sample=sample, seed=3)
        assert got.tokens == cpu.generate(PROMPTS, max_new_tokens=10, sample=sample, seed=3).tokens, sample
    # Step bundles compiled before, loaded.
    step = fusec.compile(path, inputs={"input_ids": (1, 1), "attention_mask": (1, 17), "position_ids": (1, 1),
                                       **{i["name"]: (1, i["shape"][1], 16, i["shape"][3])
                                          for i in fusec.summarize(str(path))["inputs"] if i["name"].startswith("past")}})
    loaded = fusec.Generator.from_bundles(step)
    assert loaded.capacity == 16
    assert loaded.generate(PROMPTS[:1], max_new_tokens=6).tokens == [cpu.generate(PROMPTS[:1], max_new_tokens=6).tokens[0]]
