"""Loads the compiled module zenflow._C once."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def native() -> ModuleType:
    from . import _C

    return _C
