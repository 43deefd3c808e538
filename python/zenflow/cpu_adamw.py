"""zenflow.CPUAdamW: a drop-in for torch.optim.AdamW on CPU parameters, running zenflow's
SIMD host kernels on zenflow's own thread pool (through zenflow.ops.cpu_adamw_step, the
same conversion path as every op).

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

from . import ops
from ._native import native
from ._omp import pause_openmp_workers
from .ops._args import number

__all__ = ["CPUAdamW", "default_num_threads"]

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_STRIDED = torch.strided
_SUPPORTED = (torch.float32, *_LOW_PRECISION)
_FP32_STATE = ("exp_avg", "exp_avg_sq", "master")
# Sending torch's idle OpenMP workers to sleep before the update costs a join of those
# workers (and torch's next parallel region starts them again): measured on 2 cores, it
# made a 1M-element step several times slower and a 16M-element step faster
# (benchmarks/results/2026-12-03-cpu-adamw-defaults.md). Only steps this large pause them.
_PAUSE_OPENMP_MIN_ELEMENTS = 8 << 20


def default_num_threads(pt_reserved_cores_perc: float = 0.5) -> int:
    """Threads for a host pool that runs beside the training framework when a share
    `pt_reserved_cores_perc` of this process's cores stays with the framework:
    max(1, cores - floor(cores * share)). (The process-wide pool that runs the plain ops
    and CPUAdamW has one thread per usable core: the caller waits inside those calls.)"""
    share = number("pt_reserved_cores_perc", pt_reserved_cores_perc)
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"pt_reserved_cores_perc: must be in [0, 1], got {share}")
    cores = native().host_cpu_count()
    return max(1, cores - math.floor(cores * share))


def _check_number(name: str, value: Any, low: float, high: float | None = None) -> float:
    value = number(name, value)
    if not math.isfinite(value) or value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be finite and {bound}, got {value}")
    return value


def _next_steps(step_tensors: list[torch.Tensor]) -> list[int]:
    """torch's `step` after its increment, for every tensor: one read for all of them."""
    try:
        values = torch.stack(step_tensors).tolist()
    except (RuntimeError, TypeError):  # mixed shapes, dtypes or devices: one by one
        values = [t.item() for t in step_tensors]
    return [int(v) + 1 for v in values]


class CPUAdamW(torch.optim.Optimizer):
    """AdamW (or Adam with `decoupled_weight_decay=False`) for CPU parameters.

    Same constructor as `torch.optim.AdamW`; `amsgrad`, `capturable` and `differentiable`
    are not supported (ValueError). `foreach` and `fused` are accepted and ignored: every
    step is one fused pass per tensor. Per-step Python work is about 8 us per parameter
    tensor and does not depend on tensor sizes: every parameter sharing betas, eps, mode
    and precision goes to the native kernel in one call, whatever its group (lr and weight
    decay are per tensor), through zenflow.ops.cpu_adamw_step. A step is all-or-nothing:
    if it raises, parameters, moments and state["step"] are as they were. Every written
    parameter's autograd version is bumped, as torch.optim.AdamW's in-place update does.

    num_threads: resize zenflow's (process-wide) host pool; None keeps it (by default one
    thread per usable core: the training loop waits inside step(), so the cores it leaves
    idle are used). Before a large update (8M elements or more), the idle OpenMP workers of
    torch are sent to sleep (omp_pause_resource_all), so that they do not spin on the cores
    the pool needs.
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

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One AdamW step on every parameter with a gradient.

        All-or-nothing: every hyper-parameter and parameter is checked before anything is
        written, so a step that raises leaves parameters, moments and state["step"] as they
        were (new state is only recorded once every update succeeded).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # One native call per distinct (betas, eps, mode, maximize, precision): per-tensor lr
        # and weight decay let one call cover several groups.
        buckets: dict[tuple, tuple[list, ...]] = {}
        new_states: dict[torch.Tensor, dict] = {}
        step_tensors: list[torch.Tensor] = []
        # Parallel lists, no per-parameter tuples: this loop runs for every parameter of
        # every step, and each container it allocates feeds Python's garbage collector.
        checked_params: list[torch.Tensor] = []
        checked_grads: list[torch.Tensor] = []
        elements = 0
        for index, group in enumerate(self.param_groups):
            lr = _check_number(f"param_groups[{index}].lr", group["lr"], 0.0)
            wd = _check_number(f"param_groups[{index}].weight_decay", group["weight_decay"], 0.0)
            eps = _check_number(f"param_groups[{index}].eps", group["eps"], 0.0)
            betas = group["betas"]
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"param_groups[{index}].betas: expected a pair, got {betas!r}")
            beta1 = _check_number(f"param_groups[{index}].betas[0]", betas[0], 0.0, 1.0)
            beta2 = _check_number(f"param_groups[{index}].betas[1]", betas[1], 0.0, 1.0)
            mode = "adamw" if group["decoupled_weight_decay"] else "adam"
            scale = -1.0 if group["maximize"] else 1.0
            # The group's two bucket keys, built once (not once per parameter).
            group_keys = {
                False: (beta1, beta2, eps, mode, scale, False),
                True: (beta1, beta2, eps, mode, scale, True),
            }
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.layout is not _STRIDED:
                    raise RuntimeError("CPUAdamW does not support sparse gradients")
                checked_params.append(p)
                checked_grads.append(grad)
                state = self.state.get(p)
                if not state:
                    state = self._new_state(p)
                    new_states[p] = state
                low_precision = p.dtype in _LOW_PRECISION
                key = group_keys[low_precision]
                lists = buckets.get(key)
                if lists is None:
                    lists = buckets[key] = ([], [], [], [], [], [], [], [])
                masters, exp_avgs, exp_avg_sqs, grads, outs, steps, lrs, wds = lists
                if low_precision:
                    masters.append(state["master"])
                    outs.append(p)
                else:
                    masters.append(p)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                grads.append(grad if grad.is_contiguous() else grad.contiguous())
                steps.append(state["step"])
                lrs.append(lr)
                wds.append(wd)
                elements += p.numel()
        # One native call validates everything before it writes anything; with several
        # calls, a later one must not fail after an earlier one wrote: check what the
        # native layer would reject first.
        if len(buckets) > 1:
            for p, grad in zip(checked_params, checked_grads):
                self._check_param(p, grad)
        for lists in buckets.values():
            step_tensors += lists[5]
            lists[5][:] = _next_steps(lists[5])
        if elements >= _PAUSE_OPENMP_MIN_ELEMENTS:
            pause_openmp_workers()
        for (beta1, beta2, eps, mode, scale, low_precision), lists in buckets.items():
            masters, exp_avgs, exp_avg_sqs, grads, outs, steps, lrs, wds = lists
            ops.cpu_adamw_step(
                masters,
                exp_avgs,
                exp_avg_sqs,
                grads,
                step=steps,
                lr=lrs,
                betas=(beta1, beta2),
                eps=eps,
                weight_decay=wds,
                mode=mode,
                grad_scale=scale,
                out_params=outs if low_precision else None,
            )
        # Every update succeeded: record the new state and the step counts.
        for p, state in new_states.items():
            self.state[p] = state
        if step_tensors:
            try:
                native().add_to_scalars(step_tensors, 1.0)
            except (ValueError, TypeError):  # a step that is not a 1-element fp32 CPU tensor
                torch._foreach_add_(step_tensors, 1.0)
        return loss

    @staticmethod
    def _check_param(p: torch.Tensor, grad: torch.Tensor) -> None:
        """What the native call would reject, checked before any bucket runs."""
        if grad.is_sparse or grad.layout != torch.strided:
            raise RuntimeError("CPUAdamW does not support sparse gradients")
        if p.device.type != "cpu" or grad.device.type != "cpu":
            raise ValueError(
                f"params: CPUAdamW updates CPU tensors, got a parameter on {p.device} "
                f"with a gradient on {grad.device}"
            )
        if p.dtype not in _SUPPORTED:
            raise TypeError(f"params: CPUAdamW takes float32, bfloat16 and float16, got {p.dtype}")
        if grad.dtype not in _SUPPORTED:
            raise TypeError(
                f"grads: CPUAdamW takes float32, bfloat16 and float16, got {grad.dtype}"
            )
        if grad.shape != p.shape:
            raise ValueError(
                f"grads: shape {list(grad.shape)} differs from the parameter's {list(p.shape)}"
            )
        if not p.is_contiguous():
            raise ValueError("params: CPUAdamW updates contiguous parameters")

    @staticmethod
    def _new_state(p: torch.Tensor) -> dict:
        state = {
            "step": torch.tensor(0.0, dtype=torch.float32),
            "exp_avg": torch.zeros(p.shape, dtype=torch.float32),
            "exp_avg_sq": torch.zeros(p.shape, dtype=torch.float32),
        }
        if p.dtype in _LOW_PRECISION:
            state["master"] = p.detach().to(torch.float32, copy=True)
        return state

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
