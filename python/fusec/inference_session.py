"""The part of ONNX Runtime's Python API that scripts use, on fusec: `InferenceSession` with
`get_inputs()`, `get_outputs()` and `run(output_names, feed)`, `SessionOptions`,
`get_available_providers()`. A script runs on fusec by changing its import
(`import fusec as ort`).

A session compiles the model on first use for the shapes of the feed given (a bundle per set
of input shapes, NVRTC's output reused through the kernel cache), or once for ranges of sizes
given as `dims={"batch": (1, 32), "seq": (1, 512)}` that then serve every request.
"""

from __future__ import annotations

import collections
import logging
import os
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

from . import _fusec

logger = logging.getLogger("fusec")

# ONNX Runtime's names for element types, by NumPy's.
_ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)",
    "float64": "tensor(double)",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "bool": "tensor(bool)",
}


class NodeArg:
    """An input or output of the model: `name`, `type` (ONNX Runtime's name: `tensor(float)`)
    and `shape` (ints for fixed dims, the dim's name for a named one, None for neither)."""

    def __init__(self, name: str, type: str, shape: list[Any] | None) -> None:
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class SessionOptions:
    """Accepted for compatibility; fusec's choices (fusion, CUDA graphs, GEMM tuning) are its
    own. Attributes set on it are kept and ignored."""

    def __init__(self) -> None:
        self.graph_optimization_level = None
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.log_severity_level = 2


def get_available_providers() -> list[str]:
    """`["CUDAExecutionProvider"]` where a CUDA driver is present, else `[]`."""
    return ["CUDAExecutionProvider"] if _fusec.cuda_available() else []


def get_device() -> str:
    """"GPU" where a CUDA driver is present, else "CPU" (which fusec cannot run on)."""
    return "GPU" if _fusec.cuda_available() else "CPU"


def _node_arg(value: Mapping[str, Any]) -> NodeArg:
    return NodeArg(value["name"], _ORT_TYPES.get(value["dtype"], f"tensor({value['dtype']})"), value["shape"])


class InferenceSession:
    """An ONNX model run by fusec with ONNX Runtime's interface.

    path_or_bytes: the ONNX file, or its bytes (written to a temporary file; external data
        then cannot be found).
    sess_options, providers, provider_options: accepted and ignored (fusec runs on the GPU).
    dims: ranges of sizes, `{"batch": (1, 32), "seq": (1, 512)}`, compiled into one bundle at
        the first run that serves every shape in them; without it each new set of input
        shapes compiles a bundle of its own (the last `sessions_kept` stay loaded). A list of
        such mappings compiles a bundle for each on first use, and each run goes to the first
        whose sizes its inputs fit (by the dims' names in the model's declared input shapes) —
        a decoder's loop: `[{"seq": (1, 512), "past": 0, "total": "past+seq"}, {"seq": 1,
        "past": (0, 2047), "total": "past+seq"}]`, the prompt and every later step.
    precision: "fp32" (default, what ONNX Runtime computes in), "fp16" or "bf16".
    device: the GPU.

    Unsupported ops raise `CompileError` here, naming the nodes; `run` raises `InputError`
    for a feed that does not fit the model's declared inputs, naming the input.
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Any] | None = None,
        *,
        dims: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        precision: str = "fp32",
        device: int = 0,
        sessions_kept: int = 4,
    ) -> None:
        self._temporary = None
        if isinstance(path_or_bytes, (bytes, bytearray)):
            handle, path = tempfile.mkstemp(suffix=".onnx")
            with os.fdopen(handle, "wb") as f:
                f.write(path_or_bytes)
            self._temporary = path
            self._model = path
        else:
            self._model = os.fspath(path_or_bytes)
        summary = _fusec.summarize(self._model)
        if summary["unsupported"]:
            nodes = ", ".join(f"{node} ({op})" for node, op in summary["unsupported"][:8])
            raise _fusec.CompileError(f"{self._model}: ops fusec does not support: {nodes}")
        self._inputs = [_node_arg(i) for i in summary["inputs"]]
        self._outputs = [_node_arg(o) for o in summary["outputs"]]
        self._outputs_inferred = False
        self._declared = {i["name"]: i for i in summary["inputs"]}
        if not dims:
            self._dims: list[dict[str, Any]] | None = None
        elif isinstance(dims, Mapping):
            self._dims = [dict(dims)]
        else:
            self._dims = [dict(d) for d in dims]
        self._precision = precision
        self._device = device
        self._kept = max(1, sessions_kept)
        self._sessions: collections.OrderedDict[Any, Any] = collections.OrderedDict()

    def __del__(self) -> None:
        if getattr(self, "_temporary", None):
            try:
                os.unlink(self._temporary)
            except OSError:
                pass

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs (initializers excluded), as declared."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs, as declared, with the named dims that the graph fixes whatever
        the inputs' sizes given as numbers (as ONNX Runtime reports them)."""
        if not self._outputs_inferred:
            self._outputs_inferred = True
            try:
                fixed = _fusec.fixed_output_dims(self._model)
            except _fusec.Error as e:
                logger.debug("output shapes as declared: %s", e)
                fixed = []
            for arg, dims in zip(self._outputs, fixed):
                if arg.shape is not None and len(arg.shape) == len(dims):
                    arg.shape = [n if isinstance(d, str) and n is not None else d for d, n in zip(arg.shape, dims)]
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider"]

    def get_session_options(self) -> SessionOptions:
        return SessionOptions()

    def _check(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The feed as contiguous arrays, checked against the declared inputs."""
        declared = self._declared
        for name in feed:
            if name not in declared:
                names = ", ".join(declared)
                raise _fusec.InputError(f"'{name}' is not an input of the model (its inputs: {names})")
        arrays = {}
        for name, spec in declared.items():
            if name not in feed:
                raise _fusec.InputError(f"input '{name}' was not given ({self._describe(spec)})")
            array = np.ascontiguousarray(feed[name])
            if array.dtype.name != spec["dtype"]:
                raise _fusec.InputError(
                    f"input '{name}' is {array.dtype.name}, the model takes {self._describe(spec)}"
                )
            shape = spec["shape"]
            if shape is not None:
                fixed_ok = all(not isinstance(d, int) or d == n for d, n in zip(shape, array.shape))
                if len(shape) != array.ndim or not fixed_ok:
                    raise _fusec.InputError(
                        f"input '{name}' has shape {list(array.shape)}, the model takes {self._describe(spec)}"
                    )
            arrays[name] = array
        return arrays

    @staticmethod
    def _describe(spec: Mapping[str, Any]) -> str:
        return f"{spec['dtype']}{spec['shape']}"

    def _sizes(self, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each named dim of the declared inputs' shapes, at its size in `arrays`."""
        sizes: dict[str, int] = {}
        for name, spec in self._declared.items():
            for d, n in zip(spec["shape"] or [], arrays[name].shape):
                if isinstance(d, str) and d:
                    sizes.setdefault(d, n)
        return sizes

    def _dims_for(self, arrays: Mapping[str, np.ndarray]) -> int:
        """The first of `dims` whose sizes `arrays` fit (a dim the inputs do not name fits any
        size); with one mapping, that one (its bundle then says why a feed is outside it)."""
        assert self._dims is not None
        sizes = self._sizes(arrays)

        def fits(dims: Mapping[str, Any]) -> bool:
            for symbol, want in dims.items():
                got = sizes.get(symbol)
                if got is None:
                    continue
                if isinstance(want, str):
                    parts = [p.strip() for p in want.split("+")]
                    if all(p in sizes for p in parts) and got != sum(sizes[p] for p in parts):
                        return False
                elif isinstance(want, int):
                    if got != want:
                        return False
                elif not want[0] <= got <= want[1]:
                    return False
            return True

        for i, dims in enumerate(self._dims):
            if fits(dims):
                return i
        if len(self._dims) == 1:
            return 0
        raise _fusec.InputError(f"the inputs' sizes {sizes} fit none of dims {self._dims}")

    def _session_for(self, arrays: Mapping[str, np.ndarray]) -> Any:
        which = self._dims_for(arrays) if self._dims else None
        key: Any = ("ranges", which) if self._dims else tuple((n, a.shape) for n, a in arrays.items())
        session = self._sessions.get(key)
        if session is not None:
            self._sessions.move_to_end(key)
            return session
        from . import Session, compile

        if not _fusec.cuda_available():
            raise _fusec.DeviceError(
                "no CUDA driver: libcuda.so was not found (fusec runs models on an NVIDIA GPU)"
            )
        if self._dims:
            assert which is not None
            logger.info("compiling %s for %s", self._model, self._dims[which])
            bundle = compile(self._model, dims=self._dims[which], precision=self._precision)
        else:
            shapes = {n: a.shape for n, a in arrays.items()}
            logger.info("compiling %s for %s", self._model, shapes)
            bundle = compile(self._model, inputs=shapes, precision=self._precision)
        session = Session(bundle, self._device)
        self._sessions[key] = session
        while len(self._sessions) > self._kept:
            self._sessions.popitem(last=False)
        return session

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        """The outputs named (all when None or empty), as NumPy arrays, for `input_feed`
        (`{name: array}`); compiles on the first run for a new set of shapes."""
        arrays = self._check(input_feed)
        session = self._session_for(arrays)
        return session.run(output_names or None, arrays)
