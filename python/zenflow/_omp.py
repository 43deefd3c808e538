"""Quieting the framework's OpenMP workers before zenflow's own pool runs.

After a parallel region, libgomp's (or Intel's libiomp's) worker threads spin for a while
waiting for the next one. On a machine with few cores those spinning threads take the
cores zenflow's pool is about to use. omp_pause_resource_all (OpenMP 5.0) sends them to
sleep; the next torch parallel region wakes them again. Only the OpenMP runtime already
loaded into the process (by torch) is touched; nothing is loaded.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t
_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _pause_function() -> Callable[[int], int] | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1]
        if not name.startswith(_RUNTIMES):
            continue
        try:
            library = ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
            function = library.omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_int]
        function.restype = ctypes.c_int
        return function
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
