"""Moving the unselected columns between the device matrices and one packed staging buffer,
and the device side of a selection change (zenflow/pack.h; docs/design.md sections 2 and 3).

The packed layout: matrix i ([m_i, n_i] with k_i selected columns) starts at
packed_offsets(...)[i] and holds its n_i - k_i unselected columns in ascending order,
column-major (each column's m_i values contiguous). The host optimizer consumes that buffer
as it is (cpu_accumulate, cpu_adamw_step_skip_columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _arrays
from .._native import native
from ._args import as_list, integer
from .optim import ColumnState

__all__ = [
    "exchange_selected_columns",
    "pack_columns",
    "packed_offsets",
    "scatter_columns",
]

_PACKED_DTYPES = ("float32", "float16", "bfloat16")


def packed_offsets(shapes: Sequence[tuple[int, int]], ks: Sequence[int]) -> list[int]:
    """Offsets of a packed buffer; shapes are W's (m, n), rows first (a transposed (n, m) gives other offsets, not detected).

    The start of every matrix, plus the total at the end (zf_packed_layout): matrix i
    ([m_i, n_i], k_i selected) holds m_i * (n_i - k_i) elements from offsets[i]."""
    shapes = as_list("shapes", shapes)
    ks = as_list("ks", ks)
    if len(ks) != len(shapes):
        raise ValueError(f"ks: has {len(ks)} counts for {len(shapes)} shapes")
    rows, cols = [], []
    for i, shape in enumerate(shapes):
        if not isinstance(shape, (list, tuple)) or len(shape) != 2:
            raise TypeError(f"shapes[{i}]: expected (rows, cols), got {shape!r}")
        rows.append(integer(f"shapes[{i}][0]", shape[0]))
        cols.append(integer(f"shapes[{i}][1]", shape[1]))
    counts = [integer(f"ks[{i}]", k) for i, k in enumerate(ks)]
    for name, values in (("shapes", rows), ("shapes", cols), ("ks", counts)):
        for i, v in enumerate(values):
            if not -(2**63) <= v < 2**63:
                raise ValueError(f"{name}[{i}]: {v} does not fit in 64 bits")
    return list(native().packed_layout(rows, cols, counts))


def pack_columns(
    grads: Sequence[Any],
    selected: Sequence[Any] | None = None,
    *,
    out: Any = None,
    dtype: str | None = None,
    scale: Any = None,
    stream: int | None = None,
) -> Any:
    """G[:, unselected] of row-major gradients [m, n] into one 1-D column-major staging buffer.

    Matrix i occupies packed_offsets(...)[i] onwards; its j-th unselected column (ascending)
    is m_i contiguous values. dtype: 'float32', 'float16' or 'bfloat16' (default: the
    gradients' dtype); values convert through fp32, rounding to nearest even. scale:
    optional 1-element float32 array multiplied in before the rounding.
    """
    grads = as_list("grads", grads)
    if selected is not None:
        selected = as_list("selected", selected)
    allocate = None
    if out is None:
        if not grads:
            raise ValueError("grads: empty list (no array to take the device from); pass out=")
        anchor = grads[0]
        _arrays.family(anchor, "grads[0]")
        name = _arrays.check_dtype(dtype or _arrays.dtype_name(anchor), "dtype", _PACKED_DTYPES)
    elif dtype is not None:
        raise ValueError("dtype: give either out= or dtype=, not both")
    handle = _arrays.current_stream(out if out is not None else grads[0], stream)
    if out is None:

        def allocate(total: int) -> Any:
            return _arrays.empty_on_stream(anchor, (total,), name, handle)

    return native().pack_columns(grads, selected, out, allocate, scale, handle)


def scatter_columns(
    packed: Any,
    params: Sequence[Any],
    selected: Sequence[Any] | None = None,
    *,
    stream: int | None = None,
) -> None:
    """W[:, unselected] <- packed, params row-major [m, n]: the inverse of pack_columns (same layout)."""
    params = as_list("params", params)
    if selected is not None:
        selected = as_list("selected", selected)
    _arrays.family(packed, "packed")
    native().scatter_columns(packed, params, selected, _arrays.current_stream(packed, stream))


def exchange_selected_columns(
    old_selected: Sequence[Any],
    new_selected: Sequence[Any],
    old_state: Sequence[ColumnState],
    new_state: Sequence[ColumnState],
    entering: Sequence[ColumnState] | ColumnState,
    leaving: Sequence[ColumnState] | ColumnState,
    *,
    entering_counts: Sequence[int] | None = None,
    leaving_counts: Sequence[int] | None = None,
    stream: int | None = None,
) -> None:
    """Device side of a selection change: states compact [m, k], entering/leaving [E, m] (shapes checked; square ones cannot be).

    zenflow/pack.h: new_state [m, k_new] takes the staying columns from old_state and the
    entering ones from `entering` (packed host layout [E, m], ascending column order); the
    leaving columns go to `leaving` ([L, m]).
    Master, moments and step counts move unchanged.

    Two forms of `entering` / `leaving`:

    - one ColumnState per matrix ([E_i, m_i], steps [E_i]);
    - with entering_counts= and leaving_counts= (E_i and L_i of every matrix): one
      ColumnState each for all matrices (zf_exchange_selected_columns_packed), contiguous
      fp32 fields of sum_i E_i * m_i elements with matrix i's columns from
      packed_offsets([(m_j, E_j)], [0] * count)[i], and steps of sum_i E_i. Fewer arrays to
      convert: the form to use for many matrices.
    """
    old_selected = as_list("old_selected", old_selected)
    anchor = old_selected[0] if old_selected else None
    handle = 0 if anchor is None else _arrays.current_stream(anchor, stream)
    allocate = None if anchor is None else _arrays.workspace_allocator(anchor, handle)
    if entering_counts is None and leaving_counts is None:
        native().exchange_selected_columns(
            old_selected, new_selected, old_state, new_state, entering, leaving, allocate, handle
        )
        return
    if entering_counts is None or leaving_counts is None:
        missing = "entering_counts" if entering_counts is None else "leaving_counts"
        raise ValueError(f"{missing}: give both entering_counts= and leaving_counts=, or neither")
    counts = []
    for name, values in (("entering_counts", entering_counts), ("leaving_counts", leaving_counts)):
        values = as_list(name, values)
        # Plain ints pass as they are (this runs for every matrix of every exchange).
        if all(type(v) is int for v in values):
            checked = values
        else:
            checked = [integer(f"{name}[{i}]", v) for i, v in enumerate(values)]
        for i, v in enumerate(checked):
            if not 0 <= v < 2**31:
                raise ValueError(f"{name}[{i}]: {v} is not a column count (0 to 2**31 - 1)")
        counts.append(checked)
    native().exchange_selected_columns_packed(
        old_selected,
        new_selected,
        old_state,
        new_state,
        counts[0],
        entering,
        counts[1],
        leaving,
        allocate,
        handle,
    )
