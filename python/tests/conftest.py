"""Shared helpers: the fixture models and random, non-zero feeds for them."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import fusec

MODELS = pathlib.Path(os.environ.get("FUSEC_MODELS_DIR", pathlib.Path(__file__).resolve().parents[2] / "models"))

# Awkward sizes for the fixtures' named dims; `total` is `past + seq`.
DIMS = {"batch": 3, "seq": 13, "past": 5, "total": 18}


def model_paths() -> list[pathlib.Path]:
    return sorted(MODELS.glob("*.onnx"))


def feed_for(model: os.PathLike[str] | str, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random, non-zero inputs for every input of `model`: token ids in [1, 512) (the
    fixtures' vocabulary), floats in [-2, 2), padding masks right-padded (the first row
    whole), position ids counting from the cache's length."""
    dims = {**DIMS, **(dims or {})}
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in fusec.summarize(str(model))["inputs"]:
        shape = [d if isinstance(d, int) else dims[d] for d in spec["shape"]]
        name = spec["name"]
        if "mask" in name and spec["dtype"] == "int64":
            mask = np.ones(shape, np.int64)
            if "total" not in spec["shape"]:
                for row in range(1, shape[0]):
                    mask[row, shape[1] - row :] = 0
            feed[name] = mask
        elif name == "position_ids":
            start = dims["past"] if "past" in str(fusec.summarize(str(model))["inputs"]) else 0
            feed[name] = np.broadcast_to(np.arange(start, start + shape[1]), shape).astype(np.int64)
        elif "token_type" in name:
            types = np.zeros(shape, np.int64)
            types[:, shape[1] // 2 :] = 1
            feed[name] = types
        elif spec["dtype"] == "int64":
            feed[name] = rng.integers(1, 512, shape, dtype=np.int64)
        else:
            feed[name] = rng.uniform(-2.0, 2.0, shape).astype(spec["dtype"])
    return feed


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


gpu = pytest.mark.skipif(not fusec.cuda_available(), reason="no CUDA driver (libcuda.so): the GPU tests skip")
