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

__all__ = [
    "ColumnState",
    "ColumnStats",
    "adamw_selected_columns_",
    "column_stats",
    "exchange_selected_columns",
    "pack_columns",
    "packed_offsets",
    "scatter_columns",
    "select_topk_columns",
    "topk_count",
]


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


# ---- host optimizer (zenflow/cpu_adam.h) ----

__all__ += ["cpu_adamw_step", "cpu_adamw_step_skip_columns", "cpu_accumulate"]


def _one_or_list(name: str, value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [_arrays.prepare(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return [_arrays.prepare(value, name)]


def _optional_list(name: str, value: Any, count: int) -> list | None:
    if value is None:
        return None
    values = _one_or_list(name, value)
    if len(values) != count:
        raise ValueError(f"{name}: has {len(values)} entries for {count} params")
    return values


def _int_list(name: str, value: Any, count: int) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * count
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int or a list of ints, got {type(v).__name__}")
    if len(values) != count:
        raise ValueError(f"{name}: has {len(values)} entries for {count} params")
    return values


def _hyper(lr: float, betas: Sequence[float], eps: float, weight_decay: float, mode: str) -> tuple:
    if mode not in ("adamw", "adam"):
        raise ValueError(
            f"mode: expected 'adamw' (decoupled weight decay) or 'adam' (L2), got {mode!r}"
        )
    if len(betas) != 2:
        raise ValueError(f"betas: expected two numbers, got {betas!r}")
    numbers = {"lr": lr, "betas[0]": betas[0], "betas[1]": betas[1], "eps": eps}
    numbers["weight_decay"] = weight_decay
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    return (
        float(lr),
        float(betas[0]),
        float(betas[1]),
        float(eps),
        float(weight_decay),
        mode == "adamw",
    )


def cpu_adamw_step(
    params: Any,
    exp_avgs: Any,
    exp_avg_sqs: Any,
    grads: Any,
    *,
    step: int | Sequence[int],
    lr: float,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    mode: str = "adamw",
    grad_scale: float = 1.0,
    out_params: Any = None,
    zero_grad: bool = False,
) -> None:
    """One Adam/AdamW step, in place, on CPU tensors (one tensor or lists of them).

    params, exp_avgs, exp_avg_sqs: float32, contiguous (the fp32 master, m, v).
    grads: float32, bfloat16 or float16, same number of elements; multiplied by
    `grad_scale` first (1/S for a window's mean, times the clip coefficient).
    step: the bias-correction step (torch's `step` after its increment), one or per tensor.
    mode: "adamw" (decoupled weight decay, torch.optim.AdamW) or "adam" (L2, torch.optim.Adam).
    out_params: optional float32/bfloat16/float16 tensors that receive the updated
    parameter (round to nearest even) in the same pass. zero_grad: zero the gradients read.
    Matches torch's arithmetic; bitwise identical for any thread count and SIMD level.
    Bad input raises ValueError/TypeError naming the argument and writes nothing.
    """
    params = _one_or_list("params", params)
    count = len(params)
    lists = [
        _optional_list(n, v, count)
        for n, v in (("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs))
    ]
    grads = _optional_list("grads", grads, count)
    native().cpu_adamw_step(
        params,
        lists[0],
        lists[1],
        grads,
        _optional_list("out_params", out_params, count),
        _int_list("step", step, count),
        *_hyper(lr, betas, eps, weight_decay, mode),
        float(grad_scale),
        bool(zero_grad),
    )


def cpu_adamw_step_skip_columns(
    params: Any,
    exp_avgs: Any,
    exp_avg_sqs: Any,
    grads: Any,
    *,
    selected: Any = None,
    step: int | Sequence[int] | None = None,
    column_steps: Any = None,
    increment_steps: bool = False,
    lr: float,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    mode: str = "adamw",
    grad_scale: float = 1.0,
    out_params: Any = None,
    zero_grad: bool = False,
) -> None:
    """`cpu_adamw_step` on the unselected columns of column-major matrices.

    params, exp_avgs, exp_avg_sqs: float32 [n, m], the host copy of a weight W [m, n]
    (column j is row j here, m contiguous values). selected: int32/int64 [k] per matrix,
    strictly increasing: those columns are neither read nor written anywhere.
    grads and out_params: [n, m] (selected columns ignored) or packed [n - k, m].
    Bias correction: `step` (one per matrix) or `column_steps` (int32/int64 [n] per
    matrix; with increment_steps=True the updated columns' counts are incremented first).
    """
    params = _one_or_list("params", params)
    count = len(params)
    if (step is None) == (column_steps is None):
        raise ValueError("step/column_steps: give exactly one of them")
    native().cpu_adamw_step_skip_columns(
        params,
        _optional_list("exp_avgs", exp_avgs, count),
        _optional_list("exp_avg_sqs", exp_avg_sqs, count),
        _optional_list("grads", grads, count),
        _optional_list("out_params", out_params, count),
        _optional_list("selected", selected, count),
        _optional_list("column_steps", column_steps, count),
        None if step is None else _int_list("step", step, count),
        *_hyper(lr, betas, eps, weight_decay, mode),
        float(grad_scale),
        bool(zero_grad),
        bool(increment_steps),
    )


def cpu_accumulate(
    accumulators: Any, blocks: Any, *, scale: float = 1.0, selected: Any = None
) -> None:
    """accumulators += scale * blocks, in fp32 with one rounding (torch: A.add_(G, alpha=scale)).

    accumulators: float32 CPU tensors. blocks: float32, bfloat16 or float16. Without
    `selected`, a block has as many elements as its accumulator; with it (int32/int64 [k]
    per matrix, strictly increasing), the accumulator is column-major [n, m] and the block
    holds the packed unselected columns [n - k, m].
    """
    accumulators = _one_or_list("accumulators", accumulators)
    count = len(accumulators)
    native().cpu_accumulate(
        accumulators,
        _optional_list("blocks", blocks, count),
        _optional_list("selected", selected, count),
        float(scale),
    )


# ---- column ops: AdamW on selected columns, pack, scatter, selection exchange ----------


class ColumnState(NamedTuple):
    """Optimizer state of k columns of one [m, n] matrix (zenflow/optim.h).

    master: fp32 master copy or None; exp_avg, exp_avg_sq: fp32; steps: int32 [k], the
    Adam steps each column has received. Device ("compact") layout [m, k] row-major;
    packed host layout [k, m] (each column's m values contiguous).
    """

    master: Any
    exp_avg: Any
    exp_avg_sq: Any
    steps: Any


def _per_matrix(name: str, value: Any, count: int) -> list:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * count
    if len(values) != count:
        raise ValueError(f"{name}: has {len(values)} values for {count} matrices")
    return [float(v) for v in values]


def _states(name: str, states: Sequence[Any]) -> list:
    out = []
    for i, s in enumerate(_as_list(name, states)):
        if not isinstance(s, (tuple, list)) or len(s) != 4:
            raise TypeError(f"{name}[{i}]: expected (master, exp_avg, exp_avg_sq, steps)")
        out.append(tuple(None if t is None else _arrays.prepare(t, f"{name}[{i}]") for t in s))
    return out


def _prepared(name: str, arrays: Sequence[Any]) -> list:
    return [_arrays.prepare(a, f"{name}[{i}]") for i, a in enumerate(_as_list(name, arrays))]


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def adamw_selected_columns_(
    params: Sequence[Any],
    grads: Sequence[Any],
    selected: Sequence[Any] | None,
    state: Sequence[ColumnState],
    *,
    lr: float | Sequence[float],
    weight_decay: float | Sequence[float] = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    grad_scale: Any = None,
    noop: Any = None,
    stream: int | None = None,
) -> None:
    """In-place AdamW (torch.optim.AdamW's arithmetic) on W[:, selected] of every matrix,
    in one launch on CUDA.

    params, grads: [m, n] row-major (1-D reads as [1, n]), f32/f16/bf16; grads are read
    in place, never gathered. selected: int32 [k] ascending per matrix (from
    select_topk_columns), or None for every column (dense AdamW). state: one ColumnState
    per matrix, fp32 [m, k] (steps [k], incremented). lr, weight_decay: one value or one
    per matrix. grad_scale: optional 1-element float32 array multiplying every gradient
    (clip coefficient / loss scale), read on the device. noop: optional 1-element int32
    array; non-zero skips the whole call (overflow).
    """
    params = _prepared("params", params)
    grads = _prepared("grads", grads)
    if selected is not None:
        selected = _prepared("selected", selected)
    states = _states("state", state)
    count = len(params)
    lrs = _per_matrix("lr", lr, count)
    wds = _per_matrix("weight_decay", weight_decay, count)
    if not params:
        return
    handle = _arrays.current_stream(params[0], stream)
    beta1, beta2 = (float(b) for b in betas)
    hyper = (lrs, wds, beta1, beta2, float(eps))
    native().adamw_selected_columns(
        params, grads, selected, states, *hyper, grad_scale, noop, handle
    )


def packed_offsets(shapes: Sequence[tuple[int, int]], ks: Sequence[int]) -> list[int]:
    """Start of every matrix in a packed buffer, plus the total at the end: matrix i
    ([m_i, n_i], k_i selected) holds m_i * (n_i - k_i) elements from offsets[i]."""
    offsets = [0]
    for (m, n), k in zip(shapes, ks):
        offsets.append(offsets[-1] + m * (n - k))
    return offsets


def _matrix_shape(x: Any) -> tuple[int, int]:
    shape = _arrays.shape_of(x)
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (1, shape[0])
    cols = 1
    for s in shape[1:]:
        cols *= s
    return (shape[0], cols)


def pack_columns(
    grads: Sequence[Any],
    selected: Sequence[Any] | None = None,
    *,
    out: Any = None,
    dtype: str | None = None,
    scale: Any = None,
    stream: int | None = None,
) -> Any:
    """G[:, unselected] of every matrix into one 1-D column-major staging buffer.

    Matrix i occupies packed_offsets(...)[i] onwards; its j-th unselected column (ascending)
    is m_i contiguous values. dtype: 'float32', 'float16' or 'bfloat16' (default: the
    gradients' dtype); values convert through fp32, rounding to nearest even. scale:
    optional 1-element float32 array multiplied in before the rounding.
    """
    grads = _prepared("grads", grads)
    if selected is not None:
        selected = _prepared("selected", selected)
    if out is None:
        if not grads:
            raise ValueError("grads: empty list (no array to take the device from); pass out=")
        ks = [0] * len(grads) if selected is None else [_arrays.shape_of(s)[0] for s in selected]
        total = packed_offsets([_matrix_shape(g) for g in grads], ks)[-1]
        out = _arrays.empty(grads[0], (total,), dtype or _dtype_name(grads[0]))
    handle = _arrays.current_stream(out, stream)
    native().pack_columns(grads, selected, out, scale=scale, stream=handle)
    return out


def scatter_columns(
    packed: Any,
    params: Sequence[Any],
    selected: Sequence[Any] | None = None,
    *,
    stream: int | None = None,
) -> None:
    """W[:, unselected] <- packed, the inverse of pack_columns (same layout)."""
    packed = _arrays.prepare(packed, "packed")
    params = _prepared("params", params)
    if selected is not None:
        selected = _prepared("selected", selected)
    handle = _arrays.current_stream(packed, stream)
    native().scatter_columns(packed, params, selected, stream=handle)


def exchange_selected_columns(
    old_selected: Sequence[Any],
    new_selected: Sequence[Any],
    old_state: Sequence[ColumnState],
    new_state: Sequence[ColumnState],
    entering: Sequence[ColumnState],
    leaving: Sequence[ColumnState],
    *,
    stream: int | None = None,
) -> None:
    """Device side of a selection change (zenflow/pack.h): new_state [m, k_new] takes the
    staying columns from old_state and the entering ones from `entering` (packed host
    layout [E, m], ascending column order); the leaving columns go to `leaving` ([L, m]).
    Master, moments and step counts move unchanged."""
    old_selected = _prepared("old_selected", old_selected)
    new_selected = _prepared("new_selected", new_selected)
    args = (
        old_selected,
        new_selected,
        _states("old_state", old_state),
        _states("new_state", new_state),
        _states("entering", entering),
        _states("leaving", leaving),
    )
    if not old_selected:
        return
    anchor = old_selected[0]
    handle = _arrays.current_stream(anchor, stream)
    nbytes = native().exchange_selected_columns(*args, query=True, stream=handle)
    native().exchange_selected_columns(
        *args, workspace=_arrays.workspace(anchor, nbytes), stream=handle
    )
