"""zenflow: stall-free offloaded training of large language models.

The important gradient columns are updated in place on the GPU every step; the rest are
applied by a multithreaded SIMD CPU AdamW, asynchronously, every few steps.
"""

from __future__ import annotations

import os
import warnings

from . import config, ops
from ._native import native
from ._omp import openmp_runtime_functions
from .cpu_adamw import CPUAdamW, default_num_threads
from .ops._args import integer
from .optimizer import ZenFlowAdamW, format_stats

# The settings table of ZenFlowAdamW's docstring is generated from the engine's (no copy to drift).
ZenFlowAdamW.__doc__ = (ZenFlowAdamW.__doc__ or "") + "\n" + config.describe()

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
    "host_threads",
    "set_host_threads",
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


_HOST_THREAD_SOURCES = ("framework", "zenflow")


def host_threads() -> str:
    """Where zenflow's synchronous host ops (`zenflow.ops`, `CPUAdamW`) run their parallel
    regions: 'framework' (the OpenMP team torch runs its own ops on) or 'zenflow' (threads
    of zenflow's own). The engine's lanes (`ZenFlowAdamW`) always have threads of their own:
    they overlap the training loop."""
    return "framework" if native().parallel_runtime_is_set() else "zenflow"


def set_host_threads(source: str) -> None:
    """Choose where the synchronous host ops run (see `host_threads`).

    'framework' (the default when torch has loaded an OpenMP runtime): the training thread
    waits inside these ops, and with it torch's OpenMP team, which keeps spinning on the
    cores for a while after each torch op. Running on that team uses those threads instead
    of competing with them; get_num_threads() is the team size asked for. 'zenflow':
    zenflow's own pool, which can be pinned (set_num_threads(..., cores=...)). Results are
    the same bits either way. The environment variable ZENFLOW_HOST_THREADS sets the choice
    at import. A process forked afterwards starts on zenflow's own threads.
    """
    if source == "framework":
        functions = openmp_runtime_functions()
        if functions is None:
            raise RuntimeError(
                "source: 'framework' needs the OpenMP runtime torch runs on, and none with the "
                "GNU OpenMP entry points (GOMP_parallel) is loaded in this process"
            )
        native().use_openmp_runtime(*functions)
    elif source == "zenflow":
        native().use_own_threads()
    else:
        raise ValueError(f"source: expected 'framework' or 'zenflow', got {source!r}")


def _choose_host_threads() -> None:
    """ZENFLOW_HOST_THREADS, or the framework's team when there is one."""
    requested = os.environ.get("ZENFLOW_HOST_THREADS", "")
    if requested not in ("", *_HOST_THREAD_SOURCES):
        warnings.warn(
            f"zenflow: ZENFLOW_HOST_THREADS={requested!r} is not 'framework' or 'zenflow'; "
            "using the default",
            RuntimeWarning,
            stacklevel=3,
        )
        requested = ""
    if requested == "zenflow":
        return
    if openmp_runtime_functions() is not None:
        set_host_threads("framework")
    elif requested == "framework":
        warnings.warn(
            "zenflow: ZENFLOW_HOST_THREADS=framework, but torch has no OpenMP runtime loaded "
            "here; using zenflow's own threads",
            RuntimeWarning,
            stacklevel=3,
        )


_choose_host_threads()


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
        "cuda_build_note": n.cuda_build_note(),
        "gpus": gpus,
        "host_threads": n.get_num_threads(),
        "host_threads_source": host_threads(),
        "host_cpus": n.host_cpu_count(),
    }
