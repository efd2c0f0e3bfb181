"""fusec from Python: compile ONNX models into a few fused CUDA kernels plus cuBLAS/cuDNN calls,
and run them from NumPy arrays or PyTorch CUDA tensors.

    import fusec
    bundle = fusec.compile("model.onnx", dims={"batch": (1, 32), "seq": (1, 512)}, precision="fp16")
    session = fusec.Session(bundle)                    # or fusec.Session("model.bundle")
    logits, = session.run(["logits"], {"input_ids": ids})

A decoder exported with its key/value cache generates tokens (the loop `fusec generate` runs):

    generator = fusec.Generator("gpt2_cache.onnx", batch=2, capacity=300, precision="fp16")
    result = generator.generate([[464, 3290], [40, 588, 257]], max_new_tokens=32, sample="top-p=0.9")
    result.tokens, result.ms_per_token

An ONNX Runtime script runs on fusec by changing its import (`import fusec as ort`):
`fusec.InferenceSession(path).run(None, feed)` compiles on first use.

Errors are `fusec.Error` (and its kinds: `CompileError`, `BundleError`, `InputError`,
`DeviceError`), carrying fusec's message: the file, node, input or kernel involved.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

import numpy as np

from . import _fusec
from ._fusec import (
    Bundle,
    BundleError,
    CompileError,
    DeviceError,
    Error,
    Generation,
    Generator,
    InputError,
    cuda_available,
    nvrtc_available,
    summarize,
)
from .inference_session import (
    InferenceSession,
    NodeArg,
    SessionOptions,
    get_available_providers,
    get_device,
)

__version__ = _fusec.__version__

__all__ = [
    "Bundle",
    "BundleError",
    "DeviceTensor",
    "CompileError",
    "DeviceError",
    "Error",
    "Generation",
    "Generator",
    "InferenceSession",
    "InputError",
    "NodeArg",
    "Session",
    "SessionOptions",
    "compile",
    "cuda_available",
    "get_available_providers",
    "get_device",
    "nvrtc_available",
    "summarize",
]

logger = logging.getLogger("fusec")

Dims = Mapping[str, "int | tuple[int, int]"]


def compile(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    dims: Dims | None = None,
    inputs: Mapping[str, Sequence[int]] | None = None,
    precision: str = "fp32",
    fuse: bool = True,
    arch: str = "sm_90",
    exact_gelu: bool = False,
    cache_in_place: bool = False,
) -> Bundle:
    """Compiles the ONNX file `model` into a `Bundle` (written to `output` too when given).

    dims: a size for each symbolic dim of the model's inputs (`{"batch": 8}`), or a range
        `(low, high)` for a bundle that serves every size in it (`{"seq": (1, 512)}`), or the
        sum of others (`{"total": "past+seq"}`: a decoder's mask length, inferred where its
        `past` and `seq` are given and it is not).
    inputs: a shape per input name, for inputs whose dims have no name.
    precision: storage type of weights and activations: "fp32", "fp16" or "bf16" (inputs and
        outputs stay as the model declares them; reductions accumulate in f32).
    fuse: False compiles one kernel per ONNX node (the unfused baseline).
    exact_gelu: in fp16/bf16 builds an erf-GELU right after a GEMM is computed in its tanh form
        inside cuBLASLt's epilogue (at most 4.7e-4 apart); True keeps erf, as an epilogue
        kernel of its own (also `FUSEC_EXACT_GELU=1`).
    cache_in_place: a decoder exported with its cache (`past_key_values.*` in, `present.*`
        out, each `present` a `Concat(past, new)`): each cache input is stored inside its
        `present` output, in the storage type, and a step writes only the new positions (what
        `fusec generate` and `Generator` compile; `Bundle.inputs` names the output an input is
        `inside`). `Generator.from_bundles` takes such a step bundle.
    arch: the GPU architecture PTX is compiled for when NVRTC is available (else the bundle
        keeps CUDA sources and the session compiles them at load).

    Each stage's end is logged to the "fusec" logger at INFO (import, passes, fuse, lower,
    plan, codegen, nvrtc). Raises `CompileError` naming the file, node and stage.
    """
    model = os.fspath(model)
    logger.info("compiling %s", model)

    def progress(stage: str, seconds: float) -> None:
        logger.info("%s: %.3f s", stage, seconds)

    bundle = _fusec.compile(
        model,
        dims=dict(dims) if dims else None,
        inputs={k: tuple(v) for k, v in inputs.items()} if inputs else None,
        precision=precision,
        fuse=fuse,
        arch=arch,
        progress=progress,
        exact_gelu=exact_gelu,
        cache_in_place=cache_in_place,
    )
    if output is not None:
        bundle.save(os.fspath(output))
        logger.info("wrote %s", os.fspath(output))
    return bundle


_TORCH_DTYPES: dict[Any, str] = {}


def _torch_dtype_name(dtype: Any) -> str:
    if not _TORCH_DTYPES:
        import torch

        _TORCH_DTYPES.update(
            {
                torch.float32: "float32",
                torch.float16: "float16",
                torch.bfloat16: "bfloat16",
                torch.float64: "float64",
                torch.int64: "int64",
                torch.int32: "int32",
                torch.bool: "bool",
            }
        )
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        raise InputError(f"tensors of {dtype} are not an element type fusec takes") from None


class DeviceTensor:
    """An output of `Session.run_dlpack`: the session's own buffer, valid until the session's
    next run, taken without a copy by any DLPack consumer (`torch.from_dlpack(t)`,
    `cupy.from_dlpack(t)`). It is complete on the device when the run returns."""

    __slots__ = ("_session", "name", "dtype", "shape", "device")

    def __init__(self, session: Any, name: str, dtype: str, shape: tuple[int, ...], device: int) -> None:
        self._session = session
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.device = device

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._session.output_buffer(self.name)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA

    @property
    def data_ptr(self) -> int:
        """The device address of the first element."""
        return self._session.output_address(self.name)

    def __repr__(self) -> str:
        return f"DeviceTensor({self.name!r}, {self.dtype}{list(self.shape)}, cuda:{self.device})"


class Session:
    """A bundle loaded on one GPU: its kernels, weights and activation memory, ready to run.

    `bundle` is a `Bundle` or the path of a bundle file. The first run executes the steps one
    by one and captures them as a CUDA graph, which later runs replay (`cuda_graph=False`
    turns that off); GEMM algorithms are chosen by timing after a few runs (`tune_gemms`).

    One session serves one thread at a time (a second thread's call while one runs raises
    `RuntimeError: Already borrowed`); make one session per thread to run concurrently. The
    GIL is released while the GPU works.
    """

    def __init__(
        self,
        bundle: Bundle | str | os.PathLike[str],
        device: int = 0,
        *,
        cuda_graph: bool = True,
        tune_gemms: bool = True,
    ) -> None:
        if not isinstance(bundle, Bundle):
            bundle = Bundle.load(os.fspath(bundle))
        self._session = _fusec.Session(bundle, device, cuda_graph, tune_gemms)
        self.device = device
        self._output_index = {o["name"]: k for k, o in enumerate(self._session.outputs)}

    @property
    def bundle(self) -> Bundle:
        """The bundle it runs."""
        return self._session.bundle

    @property
    def device_name(self) -> str:
        """The GPU's name."""
        return self._session.device_name

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """The inputs: dicts of `name`, `dtype` (NumPy's name) and `shape` (ints, and the dim
        names of a range bundle)."""
        return self._session.inputs

    @property
    def outputs(self) -> list[dict[str, Any]]:
        """The outputs, as `inputs`."""
        return self._session.outputs

    @property
    def launches(self) -> int:
        """Kernel launches and library calls per run."""
        return self._session.launches

    def _wanted(self, output_names: Sequence[str] | None) -> list[int] | None:
        if output_names is None:
            return None
        try:
            return [self._output_index[n] for n in output_names]
        except KeyError as e:
            names = ", ".join(self._output_index)
            raise InputError(f"the model has no output '{e.args[0]}' (it has {names})") from None

    def run(
        self, output_names: Sequence[str] | None, feed: Mapping[str, Any]
    ) -> list[np.ndarray]:
        """Runs on host arrays (NumPy, or anything `numpy.asarray` takes), `{name: array}`, each
        of its input's element type; returns the outputs named (all when None) as NumPy arrays,
        in order. For a range bundle the inputs' shapes choose the size. Inputs are copied
        once, into page-locked memory; outputs once, from the GPU into memory that the NumPy
        arrays returned own (writable): outputs of 64 KiB and more into page-locked memory
        from the session's pool (the GPU's copy lands there directly), given back when the
        last array over it goes; smaller ones into new memory.
        """
        wanted = self._wanted(output_names)
        items = []
        for name, value in feed.items():
            array = np.asarray(value)
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            items.append((name, array))
        # Each output wanted is copied once from the GPU into memory of Rust's
        # (`Session::output_pinned`, or `output_words` for a small one), and NumPy's array is
        # made over it in place
        # (the `HostOutput` exports its type and shape through the buffer protocol).
        return [np.asarray(out) for out in self._session.run_host_outputs(items, wanted)]

    def run_torch(self, feed: Mapping[str, Any], stream: Any = None) -> dict[str, Any]:
        """Runs on PyTorch CUDA tensors of this session's GPU, `{name: tensor}`; returns
        `{name: tensor}` of every output, without a copy: the outputs are views of the
        session's own buffers (their `data_ptr()` is `output_address(name)`), valid until this
        session's next run; `.clone()` what must outlive it.

        Ordering: the run starts after the work queued so far on `stream` (a
        `torch.cuda.Stream`, or a raw `cudaStream_t` as an int; default: the current stream),
        and work queued on `stream` afterwards sees the outputs. An input tensor that is the
        session's own buffer (`input_tensor`) is read in place; any other is copied on the GPU
        into the session's buffer (one device-to-device copy).
        """
        import torch

        items = []
        for name, tensor in feed.items():
            if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda or tensor.device.index != self.device:
                where = getattr(tensor, "device", type(tensor).__name__)
                raise InputError(
                    f"input '{name}' is on {where}: run_torch takes CUDA tensors of GPU {self.device} "
                    "(use run() for host arrays)"
                )
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            items.append((name, tensor.data_ptr(), _torch_dtype_name(tensor.dtype), tuple(tensor.shape)))
        if stream is None:
            stream = torch.cuda.current_stream(self.device)
        handle = stream if isinstance(stream, int) else stream.cuda_stream
        return {name: torch.from_dlpack(capsule) for name, capsule in self._session.run_device(items, handle)}

    def run_dlpack(self, feed: Mapping[str, Any], stream: int | None = None) -> dict[str, "DeviceTensor"]:
        """Runs on CUDA tensors of this session's GPU from any DLPack producer (objects with
        `__dlpack__`: PyTorch, CuPy, JAX, ...), `{name: tensor}`; returns `{name: DeviceTensor}`,
        which any DLPack consumer takes without a copy (`torch.from_dlpack(out)`,
        `cupy.from_dlpack(out)`), views of the session's buffers valid until its next run.

        `stream`: the raw CUDA stream the inputs are ready on, passed to each producer's
        `__dlpack__` (default 1, the legacy default stream, as the DLPack protocol defines); the
        run starts after the work queued on it, and the outputs are complete when this returns.
        """
        handle = 1 if stream is None else int(stream)
        items = []
        for name, value in feed.items():
            if not hasattr(value, "__dlpack__"):
                raise InputError(f"input '{name}' ({type(value).__name__}) has no __dlpack__: use run() for host arrays")
            items.append((name, value.__dlpack__(stream=handle)))
        return {
            name: DeviceTensor(self._session, name, dtype, tuple(shape), self.device)
            for name, dtype, shape in self._session.run_dlpack(items, handle)
        }

    def input_tensor(self, name: str, shape: Sequence[int] | None = None) -> Any:
        """The session's own buffer for input `name` as a PyTorch CUDA tensor of `shape`
        (default: the input's shape, the top of a range bundle's): write it in place (on the
        stream given to `run_torch`) and pass it to `run_torch`, which then copies nothing."""
        import torch

        return torch.from_dlpack(self._session.input_buffer(name, None if shape is None else list(shape)))

    def input_address(self, name: str) -> int | None:
        """The device address of the session's buffer for input `name`."""
        return self._session.input_address(name)

    def output_address(self, name: str) -> int | None:
        """The device address of the session's buffer for output `name`."""
        return self._session.output_address(name)

    def time_rust_run(
        self,
        feed: Mapping[str, Any],
        iters: int = 100,
        raw: bool = False,
        warmup: bool = True,
        output_names: Sequence[str] | None = None,
    ) -> list[float]:
        """Seconds of each of `iters` runs of the Rust API on `feed`, timed in Rust: the
        baseline the Python layer's overhead is measured against. `raw=False`:
        `fusec::Session::run` (host tensors in and out); `raw=True`: `Session::run_host` on
        the arrays' bytes with each output copied into a new vector, what `run` does below
        Python (only `output_names` copied out, when given). `warmup`: one untimed run first."""
        items = [(n, np.ascontiguousarray(v)) for n, v in feed.items()]
        return self._session.time_rust_run(items, iters, raw, warmup, self._wanted(output_names))

    def __repr__(self) -> str:
        return f"Session({self.bundle!r}, device={self.device} ({self.device_name}))"
