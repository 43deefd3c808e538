"""The host optimizer (zenflow/cpu_adamw.h; docs/design.md section 2, steps 4 to 6, and
section 3): Adam/AdamW steps on CPU tensors, the deferral accumulator on the packed buffer,
and the moves of column state between the host layout and packed column lists.

Host state of a weight W [m, n] is column-major: [n, m], column j being the m values at
j * m (ColumnState, host layout). Unselected columns travel in the packed buffer of
pack_columns. Every call runs on zenflow's host pool, validates everything before writing
anything, and is bitwise identical for any thread count and SIMD level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._native import native
from ._args import (
    adam_hparams,
    as_list,
    flag,
    int_per_matrix,
    number,
    one_or_list,
    optional_list,
    per_matrix,
)
from .optim import ColumnState

__all__ = [
    "cpu_accumulate",
    "cpu_adamw_step",
    "cpu_adamw_step_flat",
    "cpu_adamw_step_skip_columns",
    "cpu_gather_columns",
    "cpu_scatter_columns",
]

ZERO_GRAD = 1  # ZF_CPU_ADAMW_ZERO_GRAD
INCREMENT_STEPS = 2  # ZF_CPU_ADAMW_INCREMENT_STEPS


def cpu_adamw_step(
    params: Any,
    exp_avgs: Any,
    exp_avg_sqs: Any,
    grads: Any,
    *,
    step: int | Sequence[int],
    lr: float | Sequence[float],
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float | Sequence[float] = 1e-2,
    mode: str = "adamw",
    grad_scale: float = 1.0,
    out_params: Any = None,
    zero_grad: bool = False,
) -> None:
    """One Adam/AdamW step, in place, elementwise: every tensor in params[i]'s layout (a transpose of a square one is not detected).

    params, exp_avgs, exp_avg_sqs: float32, contiguous (the fp32 master, m, v).
    grads: float32, bfloat16 or float16, same number of elements. Tensors of two or more
    dimensions must have params[i]'s shape (a transposed [n, m] for an [m, n] parameter is a
    ValueError); 1-D tensors are flat buffers read in order. Gradients are multiplied by
    `grad_scale` first (1/S for a window's mean, times the clip coefficient).
    step: the bias-correction step (torch's `step` after its increment), one or per tensor.
    lr, weight_decay: one value or one per tensor.
    mode: "adamw" (decoupled weight decay, torch.optim.AdamW) or "adam" (L2, torch.optim.Adam).
    out_params: optional float32/bfloat16/float16 tensors that receive the updated
    parameter (round to nearest even) in the same pass. zero_grad: zero the gradients read.
    Matches torch's arithmetic; bitwise identical for any thread count and SIMD level.
    Bad input raises ValueError/TypeError naming the argument and writes nothing.
    """
    params = one_or_list("params", params)
    count = len(params)
    hparams = adam_hparams(betas, eps, mode)
    native().cpu_adamw_step(
        params,
        one_or_list("exp_avgs", exp_avgs),
        one_or_list("exp_avg_sqs", exp_avg_sqs),
        one_or_list("grads", grads),
        optional_list("out_params", out_params, count),
        int_per_matrix("step", step, count),
        per_matrix("lr", lr, count),
        per_matrix("weight_decay", weight_decay, count),
        *hparams,
        number("grad_scale", grad_scale),
        ZERO_GRAD if flag("zero_grad", zero_grad) else 0,
    )


def cpu_adamw_step_flat(
    exp_avg: Any,
    exp_avg_sq: Any,
    grads: Any,
    offsets: Sequence[int],
    *,
    params: Any = None,
    master: Any = None,
    step: int | Sequence[int],
    lr: float | Sequence[float],
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float | Sequence[float] = 1e-2,
    mode: str = "adamw",
    grad_scale: float = 1.0,
    out_params: Any = None,
    zero_grad: bool = False,
) -> None:
    """cpu_adamw_step with flat fp32 state; params[i], out_params[i] in grads[i]'s layout (a square transpose is not detected).

    (zf_cpu_adamw_step_flat): tensor i's m and v are the elements [offsets[i], offsets[i] +
    n_i) of `exp_avg` and `exp_avg_sq` (float32, contiguous, any shape, read as their
    elements in order), n_i = grads[i].numel(); offsets ascend and the runs do not overlap.

    The weights, exactly one of: params, one float32 tensor per gradient updated in place
    (an fp32 model: its own master), or master, one flat float32 buffer like exp_avg (the
    fp32 masters of a bf16/fp16 model, whose rounded weights go to out_params).
    Everything else as cpu_adamw_step; bitwise identical to it on the same values.
    """
    grads = one_or_list("grads", grads)
    count = len(grads)
    if (params is None) == (master is None) and count:
        raise ValueError("params/master: give exactly one of them")
    offsets = as_list("offsets", offsets)
    native().cpu_adamw_step_flat(
        optional_list("params", params, count),
        master,
        exp_avg,
        exp_avg_sq,
        int_per_matrix("offsets", offsets, count),
        # The state runs' sizes are the gradients' (a non-array fails in the native call).
        [math.prod(getattr(g, "shape", ())) for g in grads],
        grads,
        optional_list("out_params", out_params, count),
        int_per_matrix("step", step, count),
        per_matrix("lr", lr, count),
        per_matrix("weight_decay", weight_decay, count),
        *adam_hparams(betas, eps, mode),
        number("grad_scale", grad_scale),
        ZERO_GRAD if flag("zero_grad", zero_grad) else 0,
    )


def cpu_adamw_step_skip_columns(
    state: Sequence[ColumnState],
    selected: Sequence[Any] | None = None,
    *,
    grads: Sequence[Any] | None = None,
    packed_grads: Any = None,
    packed_out: Any = None,
    lr: float | Sequence[float],
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float | Sequence[float] = 1e-2,
    mode: str = "adamw",
    grad_scale: float = 1.0,
    zero_grad: bool = False,
    increment_steps: bool = False,
) -> None:
    """Window host step; state and grads in the host layout [n, m], W transposed, never W.grad [m, n] (a square W is not checked).

    Adam/AdamW on the unselected columns of matrices held in the host layout; selected
    columns are neither read nor written anywhere.

    state: one ColumnState per matrix, host layout: exp_avg float32 [n, m] (it gives the
    shape), master (the fp32 weights) and exp_avg_sq [n, m] (or flat, n * m elements),
    steps int32 [n] (per column). selected: int32 [k] per matrix, strictly increasing, or
    None. The gradient, exactly one of: grads, [n, m] per matrix in the host layout (the
    window's accumulators, or G.t().contiguous(); selected columns ignored), or
    packed_grads, the 1-D packed
    buffer of pack_columns. packed_out: optional 1-D packed buffer (f32/bf16/f16) that
    receives the updated unselected columns (the upload copy, for scatter_columns).
    increment_steps: add 1 to each updated column's count first (as torch increments
    `step`); without it the counts are used as they are and must be >= 1.
    zero_grad: zero every gradient element consumed.
    """
    state = as_list("state", state)
    count = len(state)
    if selected is not None:
        selected = as_list("selected", selected)
    if grads is not None:
        grads = as_list("grads", grads)
    if (grads is None) == (packed_grads is None):
        raise ValueError("grads/packed_grads: give exactly one of them")
    flags = (ZERO_GRAD if flag("zero_grad", zero_grad) else 0) | (
        INCREMENT_STEPS if flag("increment_steps", increment_steps) else 0
    )
    native().cpu_adamw_step_skip_columns(
        state,
        selected,
        grads,
        packed_grads,
        packed_out,
        per_matrix("lr", lr, count),
        per_matrix("weight_decay", weight_decay, count),
        *adam_hparams(betas, eps, mode),
        number("grad_scale", grad_scale),
        flags,
    )


def cpu_accumulate(
    accumulators: Any, packed: Any, *, scale: float = 1.0, selected: Any = None
) -> None:
    """accumulators += scale * packed; with `selected`, each accumulator is the host layout [n, m], W transposed (not checked).

    In fp32 with one rounding per element (torch: A.add_(G, alpha=scale)). The accumulator
    alone gives the shape, so nothing can tell a row-major [m, n] one from the host layout.

    packed: the 1-D buffer of pack_columns (float32, bfloat16 or float16), exactly the
    packed size of the matrices. accumulators: float32 CPU tensors, one or a list. With
    `selected` (int32 [k] per matrix, strictly increasing) an accumulator is the host
    layout [n, m] and receives its packed unselected columns; without it, any shape, and
    matrix i's region of the buffer is its numel elements in order.
    """
    accumulators = one_or_list("accumulators", accumulators)
    native().cpu_accumulate(
        accumulators,
        optional_list("selected", selected, len(accumulators)),
        packed,
        number("scale", scale),
    )


def cpu_gather_columns(
    host: Sequence[ColumnState], columns: Sequence[Any], out: Sequence[ColumnState]
) -> None:
    """out[i] ([L_i, m_i]) <- columns[i] of host[i] (host layout [n_i, m_i], W transposed; a square one is not checked).

    Master, moments and step counts, nothing rounded or reset. columns: int32 [L_i],
    strictly increasing. Fields of two or more dimensions must have their layout's shape."""
    native().cpu_gather_columns(host, columns, out)


def cpu_scatter_columns(
    columns_state: Sequence[ColumnState], columns: Sequence[Any], host: Sequence[ColumnState]
) -> None:
    """columns[i] of host[i] (host layout [n, m]) <- columns_state[i] ([L, m]): the inverse of cpu_gather_columns."""
    native().cpu_scatter_columns(columns_state, columns, host)
