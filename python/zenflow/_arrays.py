"""Array-family helpers: zenflow takes torch tensors, numpy arrays and cupy arrays, and
returns results of the same family, on the same device, as its inputs."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

_DTYPES = ("float32", "float16", "bfloat16", "int32", "int64")


@functools.cache
def _torch_dtype(name: str) -> Any:
    return getattr(importlib.import_module("torch"), name)


def family(x: Any, name: str = "array") -> str:
    module = type(x).__module__.split(".")[0]
    if module in ("torch", "numpy", "cupy"):
        return module
    raise TypeError(
        f"{name}: expected a torch tensor, numpy array or cupy array, got {type(x).__name__}"
    )


def is_cuda(x: Any) -> bool:
    kind = family(x)
    if kind == "torch":
        return x.is_cuda
    return kind == "cupy"


def check_dtype(dtype: Any, name: str = "dtype", allowed: Sequence[str] = _DTYPES) -> str:
    """A dtype name zenflow can allocate ('float32', ...); torch/numpy dtypes are accepted."""
    text = str(dtype).replace("torch.", "")
    if text not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {dtype!r}")
    return text


def dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def empty(like: Any, shape: Sequence[int], dtype: str, name: str = "array") -> Any:
    """An uninitialised array of `like`'s family and device."""
    dtype = check_dtype(dtype)
    kind = family(like, name)
    if kind == "torch":
        return like.new_empty(tuple(shape), dtype=_torch_dtype(dtype))
    if kind == "cupy":
        cupy = importlib.import_module("cupy")
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(tuple(shape), dtype=dtype)
    numpy = importlib.import_module("numpy")
    if dtype == "bfloat16":
        raise TypeError("numpy has no bfloat16: pass torch tensors for bf16")
    return numpy.empty(tuple(shape), dtype=dtype)


def current_stream(like: Any, stream: int | None) -> int:
    """The CUDA stream handle to run on: the caller's, else the framework's current one;
    0 for CPU arrays."""
    if not is_cuda(like):
        return 0
    if stream is not None:
        return int(stream)
    if family(like) == "torch":
        torch = importlib.import_module("torch")
        return torch.cuda.current_stream(like.device).cuda_stream
    cupy = importlib.import_module("cupy")
    return cupy.cuda.get_current_stream().ptr


def _is_current(like: Any, stream: int) -> bool:
    if family(like) == "torch":
        torch = importlib.import_module("torch")
        return torch.cuda.current_stream(like.device).cuda_stream == stream
    cupy = importlib.import_module("cupy")
    return cupy.cuda.get_current_stream().ptr == stream


def empty_on_stream(
    like: Any, shape: Sequence[int], dtype: str, stream: int, name: str = "array"
) -> Any:
    """`empty`, with the memory taken from the caching allocator's pool of `stream` (the
    stream whose kernel uses it), as if allocated under `with torch.cuda.stream(...)`.

    torch and cupy hand a freed block back to the stream it was allocated on, for that
    stream's later work only. A block allocated on the current stream but used by a kernel
    on another one could be reused while that kernel still runs once the Python object is
    dropped (a workspace is dropped when the call returns); one from the kernel's own stream
    cannot: its next user is ordered after the kernel.
    """
    if not is_cuda(like) or _is_current(like, stream):
        return empty(like, shape, dtype, name)
    if family(like) == "torch":
        torch = importlib.import_module("torch")
        side = torch.cuda.ExternalStream(stream, device=like.device)
        with torch.cuda.stream(side):
            return empty(like, shape, dtype, name)
    cupy = importlib.import_module("cupy")
    with cupy.cuda.Device(like.device.id), cupy.cuda.ExternalStream(stream, like.device.id):
        return empty(like, shape, dtype, name)


def workspace(like: Any, nbytes: int, stream: int | None = None) -> Any:
    """Scratch memory for the query-then-run protocol, from the framework's allocator, on
    the pool of `stream` (the stream the kernels run on; None: the current one)."""
    if nbytes == 0:
        return None
    shape = ((nbytes + 7) // 8,)
    if stream is None:
        return empty(like, shape, "int64")
    return empty_on_stream(like, shape, "int64", stream, "workspace")


def workspace_allocator(like: Any, stream: int | None = None) -> Any:
    """The callable the native layer asks for scratch memory (CUDA calls only); `stream`:
    the handle the call runs on (see empty_on_stream for why it matters)."""
    return lambda nbytes: workspace(like, nbytes, stream)
