"""zenflow: stall-free offloaded training of large language models.

The important gradient columns are updated in place on the GPU every step; the rest are
applied by a multithreaded SIMD CPU AdamW, asynchronously, every few steps.
"""

from __future__ import annotations

import warnings

from . import ops
from ._native import native
from .cpu_adamw import CPUAdamW, default_num_threads
from .ops._args import integer
from .optimizer import ZenFlowAdamW, format_stats

__version__ = "0.1.0"

__all__ = [
    "ops",
    "__version__",
    "cuda_available",
    "simd_level",
    "set_simd_level",
    "supported_simd_levels",
    "get_num_threads",
    "set_num_threads",
    "info",
    "CPUAdamW",
    "default_num_threads",
    "ZenFlowAdamW",
    "format_stats",
]

_LEVELS = ("scalar", "avx2", "avx512")


def cuda_available() -> bool:
    """True when zenflow was built with CUDA and a GPU is usable. Never raises."""
    try:
        return bool(native().cuda_compiled()) and native().cuda_device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver means "no GPU", never a crash
        return False


def simd_level() -> str:
    """The CPU SIMD level in use: 'avx512', 'avx2' or 'scalar'."""
    return native().simd_level_active()


def supported_simd_levels() -> list[str]:
    top = native().simd_level_supported()
    return list(_LEVELS[: _LEVELS.index(top) + 1])


def set_simd_level(level: str) -> None:
    """Force a SIMD level at or below what the CPU supports (tests, benchmarks)."""
    native().set_simd_level(level)


def get_num_threads() -> int:
    """Size of zenflow's host thread pool (the calling thread included)."""
    return native().get_num_threads()


_INT32_MAX = 2**31 - 1


def set_num_threads(num_threads: int, cores: list[int] | None = None) -> None:
    """Resize zenflow's host thread pool; optionally pin worker i to cores[i % len(cores)].

    num_threads must be in [1, max(64, 4 * CPUs)]: more could only oversubscribe the cores.
    """
    num_threads = integer("num_threads", num_threads)
    limit = max(64, 4 * native().host_cpu_count())
    if not 1 <= num_threads <= limit:
        raise ValueError(f"num_threads: must be in [1, {limit}], got {num_threads}")
    if cores is None:
        core_ids = []
    elif isinstance(cores, (list, tuple)):
        core_ids = [integer(f"cores[{i}]", c) for i, c in enumerate(cores)]
    else:
        raise TypeError(f"cores: expected a list of CPU ids, got {type(cores).__name__}")
    for i, c in enumerate(core_ids):
        if not 0 <= c <= _INT32_MAX:
            raise ValueError(f"cores[{i}]: not a CPU id: {c}")
    native().set_num_threads(num_threads, core_ids)


def _warn_about_simd_environment() -> None:
    """ZENFLOW_SIMD set to something the CPU or zenflow cannot honour: say so where Python
    users look (the C core also prints it once to stderr)."""
    message = native().simd_environment_warning()
    if message:
        warnings.warn(f"zenflow: {message}", RuntimeWarning, stacklevel=3)


_warn_about_simd_environment()


def info() -> dict:
    """Build and runtime facts, as printed by `python -m zenflow info`."""
    n = native()
    gpus = []
    for index in range(n.cuda_device_count()):
        gpus.append(n.cuda_device_name(index))
    return {
        "version": __version__,
        "library_version": n.version(),
        "simd_level": n.simd_level_active(),
        "simd_supported": n.simd_level_supported(),
        "cuda_compiled": bool(n.cuda_compiled()),
        "cuda_architectures": n.cuda_architectures(),
        "gpus": gpus,
        "host_threads": n.get_num_threads(),
        "host_cpus": n.host_cpu_count(),
    }
