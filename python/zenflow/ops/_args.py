"""Argument normalisation shared by the ops: lists, numbers and hyper-parameters.

Arrays are not inspected here: the native layer converts every tensor once per call and
names the argument in its errors. These helpers only turn Python-level arguments (lists,
numbers, numpy and torch scalars, mode strings) into what the bindings take, with
ValueError / TypeError naming the argument.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

_MODES = {"adamw": 0, "adam": 1}  # zf_adam_mode


def as_list(name: str, value: Any) -> list | tuple:
    """A list or tuple of arrays, as given (no copy)."""
    if isinstance(value, (list, tuple)):
        return value
    raise TypeError(f"{name}: expected a list of arrays, got {type(value).__name__}")


def one_or_list(name: str, value: Any) -> list | tuple:
    """One array or a list of them."""
    if isinstance(value, (list, tuple)):
        return value
    if value is None:
        raise TypeError(f"{name}: expected an array or a list of arrays, got None")
    return [value]


def optional_list(name: str, value: Any, count: int) -> list | tuple | None:
    if value is None:
        return None
    values = one_or_list(name, value)
    if len(values) != count:
        raise ValueError(f"{name}: has {len(values)} entries for {count} params")
    return values


def _single_item(name: str, value: Any) -> Any:
    """The Python number inside a one-element torch tensor or numpy array."""
    size = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
    if size != 1:
        raise ValueError(f"{name}: expected a number or a one-element tensor, got {size} elements")
    return value.item()


def number(name: str, value: Any) -> float:
    """A real number: Python, numpy or a one-element tensor/array (bool refused)."""
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and (hasattr(value, "numel") or hasattr(value, "size")):
        item = _single_item(name, value)
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise TypeError(f"{name}: expected a real number, got {type(item).__name__}")
        return float(item)
    raise TypeError(f"{name}: expected a number, got {type(value).__name__}")


def integer(name: str, value: Any) -> int:
    """An integer: Python, numpy or a one-element integer tensor/array (bool refused)."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if hasattr(value, "item") and (hasattr(value, "numel") or hasattr(value, "size")):
        item = _single_item(name, value)
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"{name}: expected an int, got {type(item).__name__}")
        return item
    raise TypeError(f"{name}: expected an int, got {type(value).__name__}")


def per_matrix(name: str, value: Any, count: int) -> list[float] | tuple:
    """One number for every matrix, or one number per matrix."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: has {len(value)} values for {count} matrices")
        if all(type(v) is float for v in value):  # the common case, without a call per value
            return value
        return [number(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [number(name, value)] * count


def int_per_matrix(name: str, value: Any, count: int) -> list[int] | tuple:
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: has {len(value)} entries for {count} params")
        if all(type(v) is int for v in value):
            return value
        return [integer(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [integer(name, value)] * count


def adam_hparams(betas: Sequence[float], eps: Any, mode: str) -> tuple[float, float, float, int]:
    """(beta1, beta2, eps, zf_adam_mode); ranges are checked by the C core."""
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(
            f"mode: expected 'adamw' (decoupled weight decay) or 'adam' (L2), got {mode!r}"
        )
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        raise ValueError(f"betas: expected two numbers, got {betas!r}")
    return (number("beta1", betas[0]), number("beta2", betas[1]), number("eps", eps), _MODES[mode])


def flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
