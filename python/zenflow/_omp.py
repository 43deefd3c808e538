"""The framework's OpenMP runtime, as zenflow's host ops meet it.

After a parallel region, libgomp's (or Intel's libiomp's) worker threads spin for a while
waiting for the next one. On a machine with few cores those spinning threads take the
cores that a second set of threads (zenflow's own pool) is about to use. Two remedies:

- run zenflow's synchronous ops on that same OpenMP team (`openmp_runtime_functions`,
  handed to the native layer by `zenflow.set_host_threads("framework")`, the default);
- or, with zenflow's own threads, send the team to sleep first (omp_pause_resource_all,
  OpenMP 5.0; the next torch parallel region wakes it again).

Only an OpenMP runtime already loaded into the process (by torch) is touched; nothing is
loaded.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t
_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _loaded_runtimes() -> tuple[ctypes.CDLL, ...]:
    """The OpenMP runtimes mapped into this process, torch's own first."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return ()
    import torch

    torch_directory = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
    candidates = [p for p in paths if os.path.basename(p).startswith(_RUNTIMES)]
    candidates.sort(key=lambda p: (not os.path.realpath(p).startswith(torch_directory), p))
    libraries = []
    for path in candidates:
        try:
            libraries.append(
                ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
            )
        except OSError:
            continue
    return tuple(libraries)


@functools.cache
def _pause_function() -> Callable[[int], int] | None:
    for library in _loaded_runtimes():
        try:
            function = library.omp_pause_resource_all
        except AttributeError:
            continue
        function.argtypes = [ctypes.c_int]
        function.restype = ctypes.c_int
        return function
    return None


@functools.cache
def openmp_runtime_functions() -> tuple[int, int, int] | None:
    """Addresses of GOMP_parallel, omp_get_thread_num and omp_get_num_threads in the
    framework's OpenMP runtime (the GNU ABI, which LLVM's and Intel's runtimes also
    export), or None when no loaded runtime has all three."""
    names = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
    for library in _loaded_runtimes():
        try:
            functions = [getattr(library, name) for name in names]
        except AttributeError:
            continue
        return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in functions)
    return None


_enabled = True


def set_enabled(enabled: bool) -> None:
    """Turn the pause on or off (benchmarks compare both)."""
    global _enabled
    _enabled = bool(enabled)


def pause_openmp_workers() -> bool:
    """Put the loaded OpenMP runtime's idle workers to sleep; False when there is none."""
    if not _enabled:
        return False
    function = _pause_function()
    if function is None:
        return False
    return function(_OMP_PAUSE_SOFT) == 0
