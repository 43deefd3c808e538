"""zenflow.CPUAdamW: a drop-in for torch.optim.AdamW on CPU parameters, running zenflow's
SIMD host kernels on zenflow's own thread pool.

Arithmetic is torch's (see cpp/src/common/adam_math.hpp): a float32 model follows
`torch.optim.AdamW` to float32 rounding. bfloat16 / float16 parameters keep an fp32
master copy in the optimizer state ('master'); the step updates the master, m and v and
writes the rounded parameter in the same pass over memory. State is always fp32.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import chain
from typing import Any, Callable

import torch

from ._native import native

__all__ = ["CPUAdamW", "default_num_threads"]

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_SUPPORTED = (torch.float32, *_LOW_PRECISION)
_FP32_STATE = ("exp_avg", "exp_avg_sq", "master")


def default_num_threads(pt_reserved_cores_perc: float = 0.5) -> int:
    """Threads for zenflow's pool when a share `pt_reserved_cores_perc` of this process's
    cores stays with the training framework: max(1, cores - floor(cores * share)).
    With the default 0.5 this is the pool's size at start-up."""
    if not 0.0 <= pt_reserved_cores_perc <= 1.0:
        raise ValueError(f"pt_reserved_cores_perc: must be in [0, 1], got {pt_reserved_cores_perc}")
    cores = native().host_cpu_count()
    return max(1, cores - math.floor(cores * pt_reserved_cores_perc))


def _check_number(name: str, value: Any, low: float, high: float | None = None) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: a tensor hyper-parameter must have one element")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be finite and {bound}, got {value}")
    return value


class CPUAdamW(torch.optim.Optimizer):
    """AdamW (or Adam with `decoupled_weight_decay=False`) for CPU parameters.

    Same constructor as `torch.optim.AdamW`; `amsgrad`, `capturable` and `differentiable`
    are not supported (ValueError). `foreach` and `fused` are accepted and ignored: every
    step is one fused pass per tensor. Per-step Python work is a few microseconds per
    parameter tensor and does not depend on tensor sizes: each param group's tensors go to
    the native kernel in one call (two when it mixes fp32 and bf16/fp16 parameters).

    num_threads: resize zenflow's (process-wide) host pool; None keeps it, by default
    `default_num_threads()` (half the cores stay with torch's intra-op threads).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = True,
        num_threads: int | None = None,
    ) -> None:
        _check_number("lr", lr, 0.0)
        _check_number("eps", eps, 0.0)
        _check_number("weight_decay", weight_decay, 0.0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas: expected a pair of numbers, got {betas!r}")
        _check_number("betas[0]", betas[0], 0.0, 1.0)
        _check_number("betas[1]", betas[1], 0.0, 1.0)
        if amsgrad:
            raise ValueError("amsgrad: CPUAdamW does not implement AMSGrad; use torch.optim.AdamW")
        if capturable:
            raise ValueError(
                "capturable: CPUAdamW runs on the host; CUDA-graph capture does not apply"
            )
        if differentiable:
            raise ValueError("differentiable: CPUAdamW's step is not differentiable")
        if num_threads is not None:
            from . import set_num_threads

            set_num_threads(num_threads)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=False,
            maximize=maximize,
            foreach=foreach,
            capturable=False,
            differentiable=False,
            fused=fused,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype not in _SUPPORTED:
                    raise TypeError(
                        f"params: CPUAdamW takes float32, bfloat16 and float16 parameters, got {p.dtype}"
                    )

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("maximize", False)
            group.setdefault("decoupled_weight_decay", True)

    def _init_state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32)
            if p.dtype in _LOW_PRECISION:
                state["master"] = p.detach().to(torch.float32, copy=True)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = _check_number("lr", group["lr"], 0.0)
            beta1, beta2 = group["betas"]
            # Two calls at most: fp32 parameters are their own master; bf16/fp16 ones receive
            # the rounded update while their fp32 master is written.
            buckets = {False: ([], [], [], [], [], []), True: ([], [], [], [], [], [])}
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("CPUAdamW does not support sparse gradients")
                if p.device.type != "cpu":
                    raise ValueError(f"params: CPUAdamW updates CPU tensors, got one on {p.device}")
                state = self._init_state(p)
                state["step"] += 1
                low_precision = p.dtype in _LOW_PRECISION
                masters, exp_avgs, exp_avg_sqs, grads, outs, steps = buckets[low_precision]
                if low_precision:
                    masters.append(state["master"])
                    outs.append(p.detach())
                else:
                    masters.append(p.detach())
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                grads.append(grad if grad.is_contiguous() else grad.contiguous())
                steps.append(int(state["step"].item()))
            for low_precision, (
                masters,
                exp_avgs,
                exp_avg_sqs,
                grads,
                outs,
                steps,
            ) in buckets.items():
                if not masters:
                    continue
                native().cpu_adamw_step(
                    masters,
                    exp_avgs,
                    exp_avg_sqs,
                    grads,
                    outs if low_precision else None,
                    steps,
                    lr,
                    float(beta1),
                    float(beta2),
                    float(group["eps"]),
                    float(group["weight_decay"]),
                    bool(group["decoupled_weight_decay"]),
                    -1.0 if group["maximize"] else 1.0,
                    False,
                )
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, but the fp32 state (m, v, master) stays fp32 for bf16/fp16
        parameters (torch would cast it to the parameter's dtype), so a reloaded optimizer
        continues the exact trajectory. A torch.optim.AdamW state dict loads too: its
        moments are widened to fp32 and a missing master is taken from the parameter."""
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        id_to_param = dict(zip(saved_ids, params))
        super().load_state_dict(state_dict)
        for saved_id, p in id_to_param.items():
            saved = state_dict["state"].get(saved_id)
            if saved is None:
                continue
            state = self.state[p]
            for key in _FP32_STATE:
                if key in saved:
                    state[key] = (
                        saved[key].detach().to(device="cpu", dtype=torch.float32, copy=True)
                    )
            if "exp_avg" in state and p.dtype in _LOW_PRECISION and "master" not in state:
                state["master"] = p.detach().to(torch.float32, copy=True)
            if "step" in state:
                state["step"] = (
                    torch.as_tensor(state["step"], dtype=torch.float32).detach().clone().cpu()
                )
