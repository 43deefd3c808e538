"""The optimizer state layout and the device update of the selected columns
(zenflow/optim.h; docs/design.md section 2, step 3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import _arrays
from .._native import native
from ._args import adam_hparams, as_list, per_matrix

__all__ = ["ColumnState", "adamw_selected_columns_"]


class ColumnState(NamedTuple):
    """Optimizer state of a set of columns of one [m, n] matrix (zf_column_state).

    master: fp32 master copy or None; exp_avg, exp_avg_sq: fp32; steps: int32, the Adam
    steps each column has received. Layouts: device ("compact") [m, k] row-major, steps
    [k]; host [n, m] column-major, steps [n]; packed host list [L, m], steps [L].
    """

    master: Any
    exp_avg: Any
    exp_avg_sq: Any
    steps: Any


def adamw_selected_columns_(
    params: Sequence[Any],
    grads: Sequence[Any],
    selected: Sequence[Any] | None,
    state: Sequence[ColumnState],
    *,
    lr: float | Sequence[float] | None = None,
    weight_decay: float | Sequence[float] = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    mode: str = "adamw",
    lr_tensor: Any = None,
    grad_scale: Any = None,
    noop: Any = None,
    stream: int | None = None,
) -> None:
    """In-place AdamW on W[:, selected]: params, grads row-major [m, n], state compact [m, k] (a square transpose is not detected).

    torch's arithmetic, two launches per 160 matrices on CUDA, bitwise equal to the host.
    A state of shape [k, m] (the host lists' layout) is a ValueError; 1-D state is flat.

    params, grads: [m, n] row-major (1-D reads as [1, n]), f32/f16/bf16; grads are read
    in place, never gathered. selected: int32 [k] ascending per matrix (from
    select_topk_columns), or None for every column (dense AdamW). state: one ColumnState
    per matrix in the device layout, fp32 [m, k], steps int32 [k] (incremented). lr,
    weight_decay: one value or one per matrix; lr may be omitted when lr_tensor is given.
    lr_tensor: optional float32 [count] on the device, read when the work runs (it replaces
    lr; a captured CUDA graph follows an lr schedule, the decoupled decay 1 - lr * wd
    included; weight_decay itself stays baked in). grad_scale: optional 1-element float32
    array multiplying every gradient (clip coefficient / loss scale), read on the device. noop: optional 1-element int32
    array; non-zero skips the whole call (overflow). mode: 'adamw' or 'adam' (L2).
    On the host, step counts below 0 or at INT32_MAX are rejected; on CUDA a negative
    count counts as 0 and INT32_MAX stays there (zenflow/optim.h).
    """
    params = as_list("params", params)
    grads = as_list("grads", grads)
    if selected is not None:
        selected = as_list("selected", selected)
    state = as_list("state", state)
    count = len(params)
    if lr is None:
        if lr_tensor is None:
            raise TypeError("lr: required unless lr_tensor is given")
        lrs = []  # the native layer reads lr_tensor alone
    else:
        lrs = per_matrix("lr", lr, count)
    wds = per_matrix("weight_decay", weight_decay, count)
    beta1, beta2, eps, mode_id = adam_hparams(betas, eps, mode)
    handle = _arrays.current_stream(params[0], stream) if params else 0
    native().adamw_selected_columns(
        params,
        grads,
        selected,
        state,
        lrs,
        wds,
        lr_tensor,
        beta1,
        beta2,
        eps,
        mode_id,
        grad_scale,
        noop,
        handle,
    )
