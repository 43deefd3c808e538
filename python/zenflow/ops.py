"""zenflow's public low-level ops.

Every op takes torch tensors, numpy arrays or cupy arrays (through DLPack or the array
interface) and returns results of the same kind on the same device. CPU arrays run the
host implementation (SIMD, multithreaded); CUDA arrays run the CUDA kernels on the
current stream of their framework (or on `stream`, a raw cudaStream_t handle).
Bad input raises ValueError or TypeError naming the argument, and writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from . import _arrays
from ._native import native

__all__ = ["ColumnStats", "column_stats", "select_topk_columns", "topk_count"]


class ColumnStats(NamedTuple):
    """Result of `column_stats`.

    col_sq: one float32 vector [n] per gradient, c[j] = sum_i g[i, j]^2.
    total_sq: float32 scalar array, the sum of every c (the squared global norm).
    nonfinite: int32 scalar array, 1 if any gradient element is Inf or NaN.
    """

    col_sq: list
    total_sq: Any
    nonfinite: Any


def _as_list(name: str, value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{name}: expected a list of arrays, got {type(value).__name__}")


def column_stats(
    grads: Sequence[Any],
    out_col_sq: Sequence[Any] | None = None,
    *,
    accumulate: bool = False,
    stream: int | None = None,
) -> ColumnStats:
    """Per-column sums of squares of 2-D row-major gradients [m, n] (f32, f16 or bf16),
    their total, and a non-finite flag, in one read of every gradient.

    out_col_sq: optional float32 [n] outputs, one per gradient (allocated if None).
    accumulate: add into out_col_sq instead of overwriting it.
    Sums are accumulated in fp64 (fp32 within blocks of 8 rows on the host) and rounded once
    to fp32: relative error below 1e-6. On the host they are bitwise identical for every
    thread count and SIMD level.
    """
    grads = [_arrays.prepare(g, f"grads[{i}]") for i, g in enumerate(_as_list("grads", grads))]
    if accumulate and out_col_sq is None:
        raise ValueError("out_col_sq: required when accumulate=True")
    anchor = grads[0] if grads else (out_col_sq[0] if out_col_sq else None)
    if anchor is None:
        raise ValueError("grads: empty list (no array to take the device from)")
    if out_col_sq is None:
        out_col_sq = []
        for i, g in enumerate(grads):
            shape = _arrays.shape_of(g)
            if len(shape) != 2:
                raise ValueError(f"grads[{i}]: expected a 2-D tensor, got shape {list(shape)}")
            out_col_sq.append(_arrays.empty(g, (shape[1],), "float32"))
    else:
        out_col_sq = _as_list("out_col_sq", out_col_sq)
    total_sq = _arrays.empty(anchor, (), "float32")
    nonfinite = _arrays.empty(anchor, (), "int32")
    handle = _arrays.current_stream(anchor, stream)
    args = (grads, out_col_sq, total_sq, nonfinite, accumulate)
    nbytes = native().column_stats(*args, query=True, stream=handle)
    native().column_stats(*args, workspace=_arrays.workspace(anchor, nbytes), stream=handle)
    return ColumnStats(out_col_sq, total_sq, nonfinite)


def topk_count(n: int, topk_ratio: float) -> int:
    """Columns kept on the device for a matrix of n columns (DESIGN.md section 2):
    0 if topk_ratio == 0, else min(n, max(1, floor(topk_ratio * n)))."""
    if not 0.0 <= topk_ratio <= 1.0:
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

    k: one count for every vector, or one per vector; 0 <= k <= n.
    Ties go to the lower index, so the set is the same on every run and thread count.
    A NaN score raises ValueError and writes nothing.
    """
    col_sq = [_arrays.prepare(s, f"col_sq[{i}]") for i, s in enumerate(_as_list("col_sq", col_sq))]
    if isinstance(k, bool) or not isinstance(k, (int, list, tuple)):
        raise TypeError(f"k: expected an int or a list of ints, got {type(k).__name__}")
    ks = [k] * len(col_sq) if isinstance(k, int) else list(k)
    if len(ks) != len(col_sq):
        raise ValueError(f"k: has {len(ks)} counts for {len(col_sq)} score vectors")
    for i, (kk, s) in enumerate(zip(ks, col_sq)):
        if isinstance(kk, bool) or not isinstance(kk, int):
            raise TypeError(f"k[{i}]: expected an int, got {type(kk).__name__}")
        shape = _arrays.shape_of(s)
        if len(shape) != 1:
            raise ValueError(f"col_sq[{i}]: expected a 1-D tensor, got shape {list(shape)}")
        if not 0 <= kk <= shape[0]:
            raise ValueError(f"k: {kk} is outside [0, {shape[0]}] for col_sq[{i}]")
    if out_indices is None:
        out_indices = [_arrays.empty(s, (kk,), "int32") for s, kk in zip(col_sq, ks)]
    else:
        out_indices = _as_list("out_indices", out_indices)
    if not col_sq:
        return []
    handle = _arrays.current_stream(col_sq[0], stream)
    nbytes = native().select_topk_columns(col_sq, out_indices, query=True, stream=handle)
    native().select_topk_columns(
        col_sq, out_indices, workspace=_arrays.workspace(col_sq[0], nbytes), stream=handle
    )
    return out_indices
