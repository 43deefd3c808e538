"""Gradient column statistics (zenflow/norms.h; docs/design.md section 2, step 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import _arrays
from .._native import native
from ._args import as_list, flag

__all__ = ["ColumnStats", "column_stats"]


class ColumnStats(NamedTuple):
    """Result of `column_stats`.

    col_sq: one float32 vector [n] per gradient, c[j] = sum_i g[i, j]^2.
    total_sq: float32 scalar array, the sum of every c (the squared global norm).
    nonfinite: int32 scalar array, 1 if any gradient element is Inf or NaN (the same on
    the host and the device for every input; finite values too large for an fp32 sum
    give an Inf sum, not the flag).
    """

    col_sq: list
    total_sq: Any
    nonfinite: Any


def column_stats(
    grads: Sequence[Any],
    out_col_sq: Sequence[Any] | None = None,
    *,
    accumulate: bool = False,
    stream: int | None = None,
) -> ColumnStats:
    """Per-column sums of squares of row-major gradients [m, n], W's own layout (not the host layout [n, m]).

    f32, f16 or bf16; their total and a non-finite flag, in one read of every gradient. A
    transposed view is a ValueError; a contiguous [n, m] copy is a valid matrix of other
    columns and is not detected.

    out_col_sq: optional float32 [n] outputs, one per gradient (allocated if None).
    accumulate: add into out_col_sq instead of overwriting it.
    Squares are summed in fp64 and rounded once to fp32 (on the host, fp32 within blocks of
    8 rows first): relative error below 1e-6. On the host they are bitwise identical for
    every thread count and SIMD level; on the device, for every run.
    """
    grads = as_list("grads", grads)
    accumulate = flag("accumulate", accumulate)
    if accumulate and out_col_sq is None:
        raise ValueError("out_col_sq: required when accumulate=True")
    if out_col_sq is not None:
        out_col_sq = as_list("out_col_sq", out_col_sq)
    anchor = grads[0] if grads else (out_col_sq[0] if out_col_sq else None)
    if anchor is None:
        raise ValueError("grads: empty list (no array to take the device from)")
    _arrays.family(anchor, "grads[0]")
    handle = _arrays.current_stream(anchor, stream)
    if out_col_sq is None:
        out_col_sq = []
        for i, g in enumerate(grads):
            name = f"grads[{i}]"
            _arrays.family(g, name)
            shape = g.shape
            if len(shape) != 2:
                raise ValueError(f"{name}: expected a 2-D tensor, got shape {list(shape)}")
            out_col_sq.append(_arrays.empty_on_stream(g, (int(shape[1]),), "float32", handle, name))
    total_sq = _arrays.empty_on_stream(anchor, (), "float32", handle)
    nonfinite = _arrays.empty_on_stream(anchor, (), "int32", handle)
    native().column_stats(
        grads,
        out_col_sq,
        total_sq,
        nonfinite,
        accumulate,
        _arrays.workspace_allocator(anchor, handle),
        handle,
    )
    return ColumnStats(list(out_col_sq), total_sq, nonfinite)
