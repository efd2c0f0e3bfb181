"""`fusec.HostOutput`, the object a host output is handed to NumPy in: its bytes exported
through the buffer protocol with their element type and shape (no GPU needed)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import fusec
from fusec._fusec import HostOutput


@pytest.mark.parametrize(
    "dtype, shape",
    [("float32", (3, 5, 7)), ("float16", (2, 9)), ("float64", (11,)), ("int64", (4, 1, 3)),
     ("int32", (6, 5)), ("bool", (13,)), ("float32", ()), ("float32", (3, 0, 2))],
)
def test_numpy_reads_the_bytes_in_place_with_their_type_and_shape(dtype, shape):
    rng = np.random.default_rng(7)
    want = (rng.standard_normal(shape) * 100).astype(dtype) if dtype != "bool" else rng.random(shape) > 0.5
    out = HostOutput(want.tobytes(), dtype, list(shape))
    got = np.asarray(out)
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    assert np.array_equal(got, want)
    assert got.flags.c_contiguous and got.flags.writeable
    # The array is over the object's bytes: a second array sees what the first writes.
    if got.size:
        again = np.asarray(out)
        got.reshape(-1)[0] = want.reshape(-1)[-1]
        assert again.reshape(-1)[0] == want.reshape(-1)[-1]
        assert np.shares_memory(got, again)
    view = memoryview(out)
    assert view.shape == shape and view.nbytes == want.nbytes and not view.readonly


def test_the_array_keeps_the_bytes_alive():
    want = np.arange(1000, dtype=np.float32).reshape(10, 100) * 0.5
    got = np.asarray(HostOutput(want.tobytes(), "float32", [10, 100]))
    gc.collect()
    [np.zeros(1000, np.float32) for _ in range(100)]  # reuse any memory that was freed
    assert np.array_equal(got, want)


def test_bad_sizes_and_types_are_input_errors():
    with pytest.raises(fusec.InputError, match="7 bytes given for 8"):
        HostOutput(b"\0" * 7, "float32", [2])
    with pytest.raises(fusec.InputError, match="not one fusec takes"):
        HostOutput(b"\0" * 4, "complex64", [1])
    with pytest.raises(fusec.InputError, match="NumPy has no element type 'bfloat16'"):
        HostOutput(b"\0" * 4, "bfloat16", [2])
