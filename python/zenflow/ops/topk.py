"""Selection of the important columns (zenflow/topk.h; docs/design.md section 2, step 2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import _arrays
from .._native import native
from ._args import as_list, integer, number

__all__ = ["select_topk_columns", "topk_count"]


def topk_count(n: int, topk_ratio: float) -> int:
    """Columns kept on the device for a matrix of n columns (docs/design.md section 2):
    0 if topk_ratio == 0, else min(n, max(1, floor(topk_ratio * n)))."""
    n = integer("n", n)
    topk_ratio = number("topk_ratio", topk_ratio)
    if n < 0:
        raise ValueError(f"n: a column count must be >= 0, got {n}")
    if not (math.isfinite(topk_ratio) and 0.0 <= topk_ratio <= 1.0):
        raise ValueError(f"topk_ratio: must be in [0, 1], got {topk_ratio}")
    if topk_ratio == 0.0 or n == 0:
        return 0
    return min(n, max(1, int(topk_ratio * n)))


def select_topk_columns(
    col_sq: Sequence[Any],
    k: int | Sequence[int],
    *,
    out_indices: Sequence[Any] | None = None,
    stream: int | None = None,
) -> list:
    """Indices (int32, sorted ascending) of the k largest scores of every vector.

    k: one count for every vector, or one per vector; 0 <= k <= n. out_indices: optional
    int32 outputs, out_indices[i] holding exactly k_i entries.
    Ties go to the lower index, so the set is the same on every run and thread count.
    A NaN score raises ValueError and writes nothing.
    """
    col_sq = as_list("col_sq", col_sq)
    if isinstance(k, (list, tuple)):
        ks = [integer(f"k[{i}]", kk) for i, kk in enumerate(k)]
        if len(ks) != len(col_sq):
            raise ValueError(f"k: has {len(ks)} counts for {len(col_sq)} score vectors")
    else:
        ks = [integer("k", k)] * len(col_sq)
    for i, kk in enumerate(ks):
        if kk < 0:
            raise ValueError(f"k: {kk} is negative for col_sq[{i}]")
    handle = 0
    if col_sq:
        _arrays.family(col_sq[0], "col_sq[0]")
        handle = _arrays.current_stream(col_sq[0], stream)
    if out_indices is None:
        out_indices = [
            _arrays.empty_on_stream(s, (kk,), "int32", handle, f"col_sq[{i}]")
            for i, (s, kk) in enumerate(zip(col_sq, ks))
        ]
    else:
        out_indices = as_list("out_indices", out_indices)
    if not col_sq:
        native().select_topk_columns(col_sq, out_indices, ks)
        return []
    anchor = col_sq[0]
    native().select_topk_columns(
        col_sq,
        out_indices,
        ks,
        _arrays.workspace_allocator(anchor, handle),
        handle,
    )
    return list(out_indices)
