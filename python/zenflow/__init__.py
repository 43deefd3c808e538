"""zenflow: stall-free offloaded training of large language models.

The important gradient columns are updated in place on the GPU every step; the rest are
applied by a multithreaded SIMD CPU AdamW, asynchronously, every few steps.
"""

from __future__ import annotations

from . import ops
from ._native import native
from .cpu_adam import CPUAdamW, default_num_threads

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


def set_num_threads(num_threads: int, cores: list[int] | None = None) -> None:
    """Resize zenflow's host thread pool; optionally pin worker i to cores[i % len(cores)]."""
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise TypeError(f"num_threads: expected an int, got {type(num_threads).__name__}")
    native().set_num_threads(num_threads, list(cores or []))


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
