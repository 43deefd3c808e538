"""zenflow.CPUAdamW: a drop-in for torch.optim.AdamW on CPU parameters, running zenflow's
SIMD host kernels on zenflow's own thread pool (through zf_cpu_adamw_step_flat, the same
conversion path as every op).

Arithmetic is torch's (see cpp/src/common/adam_math.hpp): a float32 model follows
`torch.optim.AdamW` to float32 rounding. bfloat16 / float16 parameters keep an fp32
master copy in the optimizer state ('master'); the step updates the master, m and v and
writes the rounded parameter in the same pass over memory. State is always fp32.

State layout: the parameters sharing betas, eps, mode, maximize and precision (one
kernel batch, whatever their groups) keep their state in one flat buffer per field
(master, exp_avg, exp_avg_sq, step), parameter after parameter; each parameter's
state["exp_avg"] etc. is a view of its run, with the parameter's shape. state_dict() and
user code see per-parameter tensors as with torch; a step walks each buffer contiguously
(one memory stream per field, not one per tensor) and converts only the parameters and
gradients. Whatever user code puts in the state (a replaced entry or state, a deleted
state, a loaded state dict, a new param group) is copied into a fresh layout by the next
step, which then points the state entries at it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import accumulate, chain, repeat
from operator import attrgetter, is_, itemgetter
from typing import Any, Callable

import torch

from ._native import native
from ._omp import pause_openmp_workers
from .ops._args import _MODES as ADAM_MODES
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
    max(1, cores - ceil(cores * share)), the engine's host lane by its thread plan
    (engine.h: zf_engine_thread_plan_for, which also checks the share). (The process-wide pool
    that runs the plain ops and CPUAdamW has one thread per usable core: the caller waits
    inside those calls.)"""
    share = number("pt_reserved_cores_perc", pt_reserved_cores_perc)
    return int(native().engine_thread_plan({"pt_reserved_cores_perc": share})["host_threads"])


def _check_number(name: str, value: Any, low: float, high: float | None = None) -> float:
    value = number(name, value)
    if not math.isfinite(value) or value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be finite and {bound}, got {value}")
    return value


_ENTRIES = ("exp_avg", "exp_avg_sq", "master")
# What a group's validated values are made of (CPUAdamW._group_values).
_GROUP_KEYS = ("lr", "weight_decay", "eps", "betas", "decoupled_weight_decay", "maximize")
_IMMUTABLE_NUMBERS = (float, int, bool)
_grad_of = attrgetter("grad")


# The names the per-tensor native call gave a batch's state tensors in its errors.
_CALL_NAMES = {"exp_avg": "exp_avgs", "exp_avg_sq": "exp_avg_sqs", "master": "params"}


def _copy_state_entry(view: torch.Tensor, value: Any, name: str, position: int) -> None:
    """view <- a state entry that user code or a loaded state dict put there (any float
    tensor with the parameter's number of elements, converted to fp32). `position`: the
    parameter's place in its kernel batch."""
    value = torch.as_tensor(value)
    if value.numel() != view.numel():
        raise ValueError(
            f"{_CALL_NAMES[name]}[{position}]: state[{name!r}] of the kernel batch's parameter "
            f"{position} has {value.numel()} elements, the parameter {view.numel()}"
        )
    view.copy_(value.detach().reshape(view.shape))


class _FlatBatch:
    """The fp32 state of one kernel batch (the parameters sharing betas, eps, mode,
    maximize and precision): one flat buffer per field (master for bf16/fp16 parameters,
    exp_avg, exp_avg_sq, and the step counts), parameter after parameter in group order;
    each parameter's state entries are views into them. The kernel walks the buffers
    contiguously, and a step converts the parameters and gradients, not 3 to 4 state
    tensors per parameter."""

    def __init__(self, hyper: tuple, low_precision: bool, members: list) -> None:
        self.hyper = hyper
        self.low_precision = low_precision
        self.params = [p for p, _ in members]
        self.sizes = [p.numel() for p in self.params]
        self.offsets = list(accumulate(self.sizes, initial=0))
        total = self.offsets.pop()
        self.total = total
        # (group index, parameter count) of each group's run of parameters: lr and weight
        # decay are per group.
        self.segments: list[list[int]] = []
        for _, group_index in members:
            if self.segments and self.segments[-1][0] == group_index:
                self.segments[-1][1] += 1
            else:
                self.segments.append([group_index, 1])
        self._rates_key: tuple | None = None
        self._rates: tuple[list[float], list[float]] = ([], [])
        self.exp_avg = torch.zeros(total, dtype=torch.float32)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32)
        self.master = torch.zeros(total, dtype=torch.float32) if low_precision else None
        self.steps = torch.zeros(len(self.params), dtype=torch.float32)
        self.views: dict[str, list[torch.Tensor]] = {}
        fields = [("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)]
        if low_precision:
            fields.append(("master", self.master))
        for name, buffer in fields:
            self.views[name] = [
                buffer[o : o + n].view(p.shape)
                for p, o, n in zip(self.params, self.offsets, self.sizes)
            ]
        self.step_views = list(self.steps.unbind())
        # Per parameter: the state dict this layout knows (None: none yet), and whether it
        # is laid out here (its entries are the views above).
        self.states: list[dict | None] = [None] * len(self.params)
        self.laid_out = 0

    def load_state(self, state: dict) -> None:
        """Copies every existing state of the batch's parameters into the buffers."""
        for p in self.params:  # every count first: a bad one changes nothing
            entry = state.get(p)
            if entry and "step" in entry:
                _check_step(entry["step"])
        for i, p in enumerate(self.params):
            entry = state.get(p)
            self.states[i] = entry
            if not entry:
                continue
            if "step" not in entry or "exp_avg" not in entry or "exp_avg_sq" not in entry:
                raise ValueError(
                    "state: a parameter's state has no 'step', 'exp_avg' or 'exp_avg_sq' entry"
                )
            step = entry["step"]
            self.steps[i] = float(step.item() if isinstance(step, torch.Tensor) else step)
            for name in _ENTRIES:
                views = self.views.get(name)
                if views is None:
                    continue
                if name in entry:
                    _copy_state_entry(views[i], entry[name], name, i)
                else:  # a bf16/fp16 parameter's state without master (torch's AdamW's)
                    views[i].copy_(p.detach())
            self.laid_out += 1

    def commit(self) -> None:
        """Points every loaded state's entries at the views (after a successful step)."""
        for i, entry in enumerate(self.states):
            if entry:
                entry["step"] = self.step_views[i]
                for name, views in self.views.items():
                    entry[name] = views[i]

    def entries_moved(self) -> bool:
        """Whether user code replaced, added or deleted an entry of a state laid out here
        (the state dicts themselves are checked by _FlatLayout.state_moved)."""
        if self.laid_out == len(self.params):  # the steady state: every entry is a view
            try:
                if not all(map(is_, map(itemgetter("step"), self.states), self.step_views)):
                    return True
                return not all(
                    all(map(is_, map(itemgetter(name), self.states), views))
                    for name, views in self.views.items()
                )
            except KeyError:  # an entry deleted
                return True
        for i, entry in enumerate(self.states):
            if entry:  # laid out, or an empty state that user code filled in
                if entry.get("step") is not self.step_views[i]:
                    return True
                for name, views in self.views.items():
                    if entry.get(name) is not views[i]:
                        return True
        return False

    def rates(self, group_values: list) -> tuple[list[float], list[float]]:
        """Per-parameter lr and weight decay lists, rebuilt only when a group's change."""
        key = tuple(group_values[g][:2] for g, _ in self.segments)
        if key != self._rates_key:
            lrs: list[float] = []
            wds: list[float] = []
            for (_, count), (lr, wd) in zip(self.segments, key):
                lrs += [lr] * count
                wds += [wd] * count
            self._rates_key, self._rates = key, (lrs, wds)
        return self._rates

    def prepare(self, state: dict, group_values: list, check_state: bool):
        """This step's run of the batch: None when no parameter has a gradient, False when
        the state moved (lay it out again)."""
        grads = list(map(_grad_of, self.params))
        missing = list(map(is_, grads, repeat(None)))
        if all(missing):
            return None
        if check_state and self.entries_moved():
            return False
        lrs, wds = self.rates(group_values)
        if not any(missing):
            # The steady state: the native call reads and advances the counts itself.
            return _FlatRun(self, None, grads, None, lrs, wds)
        steps = self.steps.to(torch.int64).add_(1).tolist()
        index = [i for i, absent in enumerate(missing) if not absent]
        return _FlatRun(
            self,
            index,
            [grads[i] for i in index],
            [steps[i] for i in index],
            [lrs[i] for i in index],
            [wds[i] for i in index],
        )


def _check_step(step) -> None:
    """A loaded state's step count: in [0, 2**31 - 1), as the native step takes it (a NaN, an
    infinity or a huge float would otherwise reach a float-to-integer conversion)."""
    value = step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**31 - 1:
        raise ValueError(
            f"state: a parameter's 'step' is {value!r}, not a step count in [0, 2**31 - 1)"
        )


class _FlatRun:
    """One native call of a step: the batch's parameters with a gradient."""

    def __init__(self, batch: _FlatBatch, index, grads, steps, lrs, wds) -> None:
        self.batch = batch
        self.index = index  # None: every parameter of the batch
        self.grads = grads
        self.steps = steps  # None: the call uses and advances batch.steps itself
        self.lrs = lrs
        self.wds = wds
        if index is None:
            self.params, self.offsets, self.sizes = batch.params, batch.offsets, batch.sizes
            self.elements = batch.total
        else:
            self.params = [batch.params[i] for i in index]
            self.offsets = [batch.offsets[i] for i in index]
            self.sizes = [batch.sizes[i] for i in index]
            self.elements = sum(self.sizes)
        # Parameters whose state starts now: their master starts as the parameter (m, v
        # and the count are still zero in a batch's buffers until a state is laid out).
        positions = range(len(batch.params)) if index is None else index
        self.new_states = (
            [i for i in positions if not batch.states[i]]
            if batch.laid_out < len(batch.params)
            else []
        )
        if batch.low_precision:
            for i in self.new_states:
                batch.views["master"][i].copy_(batch.params[i].detach())

    def check_and_make_contiguous(self) -> None:
        for j, (p, grad) in enumerate(zip(self.params, self.grads)):
            CPUAdamW._check_param(p, grad)
            if not grad.is_contiguous():
                self.grads[j] = grad.contiguous()

    def _call(self) -> None:
        batch = self.batch
        beta1, beta2, eps, mode, scale = batch.hyper
        low = batch.low_precision
        native().cpu_adamw_step_flat(
            None if low else self.params,
            batch.master,
            batch.exp_avg,
            batch.exp_avg_sq,
            self.offsets,
            self.sizes,
            self.grads,
            self.params if low else None,
            [] if self.steps is None else self.steps,
            self.lrs,
            self.wds,
            beta1,
            beta2,
            eps,
            mode,
            scale,
            0,
            batch.steps if self.steps is None else None,
        )

    def execute(self, retry: bool) -> None:
        """The native call. With `retry` (the step's only call), a rejected call is
        explained by the Python checks, or retried once with contiguous gradients: a
        failed call changes nothing."""
        if not retry:
            self._call()
            return
        try:
            self._call()
        except (ValueError, TypeError, RuntimeError):
            grads = list(self.grads)
            self.check_and_make_contiguous()
            if all(map(is_, grads, self.grads)):
                raise
            self._call()

    def finish(self, state: dict) -> None:
        """After success: the new states and the incremented counts."""
        batch = self.batch
        for i in self.new_states:
            entry = {"step": batch.step_views[i]}
            for name, views in batch.views.items():
                entry[name] = views[i]
            state[batch.params[i]] = entry
            batch.states[i] = entry
            batch.laid_out += 1
        if self.steps is not None:  # (otherwise the native call advanced them)
            batch.steps[self.index] += 1.0


class _FlatLayout:
    """The flat state of every kernel batch of the optimizer's groups: of the parameters
    that have a state or a gradient when it is laid out. The others (frozen ones, say) get
    no memory, as torch allocates state only at a parameter's first step; when one of them
    gets a gradient, the step lays the state out again."""

    def __init__(self, param_groups: list, group_values: list, signature: list, state) -> None:
        self.signature = signature
        members: dict[tuple, list] = {}
        self.outside: list[torch.Tensor] = []
        for group_index, group in enumerate(param_groups):
            hyper = group_values[group_index][2]
            for p in group["params"]:
                if p.grad is None and not state.get(p):
                    self.outside.append(p)
                    continue
                if p.dtype not in _SUPPORTED:
                    raise TypeError(
                        f"params: CPUAdamW takes float32, bfloat16 and float16 parameters, got {p.dtype}"
                    )
                low_precision = p.dtype in _LOW_PRECISION
                members.setdefault((hyper, low_precision), []).append((p, group_index))
        self.batches = [_FlatBatch(hyper, low, m) for (hyper, low), m in members.items()]
        self.state_dict_object = None
        self.state_keys: list = []
        self.state_values: list = []
        for batch in self.batches:
            batch.load_state(state)

    def snapshot(self, state: dict) -> None:
        """Records the optimizer's state dicts (after a successful step)."""
        self.state_dict_object = state
        self.state_keys = list(state.keys())
        self.state_values = list(state.values())

    def state_moved(self, state: dict) -> bool:
        """Whether a state was added, removed or replaced since the snapshot: the same
        keys and values in the same order mean the same state dicts (iterating the dict
        hashes nothing; torch.Tensor.__hash__ is a Python function)."""
        return not (
            state is self.state_dict_object
            and len(state) == len(self.state_keys)
            and all(map(is_, state.keys(), self.state_keys))
            and all(map(is_, state.values(), self.state_values))
        )

    def prepare(self, state: dict, group_values: list, check_state: bool) -> list | None:
        """This step's native calls, or None when the state must be laid out again."""
        if check_state and self.state_moved(state):
            return None
        if self.outside and not all(map(is_, map(_grad_of, self.outside), repeat(None))):
            return None  # a parameter outside the layout has a gradient now
        runs = []
        for batch in self.batches:
            run = batch.prepare(state, group_values, check_state)
            if run is False:
                return None
            if run is not None:
                runs.append(run)
        return runs

    def commit(self, state: dict) -> None:
        for batch in self.batches:
            batch.commit()


class CPUAdamW(torch.optim.Optimizer):
    """AdamW (or Adam with `decoupled_weight_decay=False`) for CPU parameters.

    Same constructor as `torch.optim.AdamW`; `amsgrad`, `capturable` and `differentiable`
    are not supported (ValueError). `foreach` and `fused` are accepted and ignored: every
    step is one fused pass over each batch's flat state (see the module docstring). Every
    parameter sharing betas, eps, mode and precision goes to the native kernel in one call,
    whatever its group (lr and weight decay are per tensor); per-step Python work is about
    2 us per parameter tensor, mostly converting the parameter and its gradient, and does
    not depend on tensor sizes. A step is all-or-nothing: if it raises, parameters, moments,
    state["step"] and the state's tensors are as they were (a new layout is only recorded
    once every update succeeded). Every written tensor's autograd version is bumped, as
    torch.optim.AdamW's in-place update does.

    num_threads: resize zenflow's (process-wide) host pool; None keeps it (by default one
    thread per usable core: the training loop waits inside step(), so the cores it leaves
    idle are used). The pool runs on torch's own OpenMP team by default
    (zenflow.host_threads()), the threads that would otherwise spin idle after the backward
    pass. On zenflow's own threads instead, a large update (8M elements or more) first sends
    torch's idle OpenMP workers to sleep (omp_pause_resource_all), so that they do not spin
    on the cores the pool needs.
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
        self._flat_layout: _FlatLayout | None = None
        self._group_cache: tuple = ((), [])
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype not in _SUPPORTED:
                    raise TypeError(
                        f"params: CPUAdamW takes float32, bfloat16 and float16 parameters, got {p.dtype}"
                    )

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # Loaded or unpickled state is laid out again by the next step.
        self._flat_layout = None
        self._group_cache = ((), [])
        for group in self.param_groups:
            group.setdefault("maximize", False)
            group.setdefault("decoupled_weight_decay", True)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One AdamW step on every parameter with a gradient.

        All-or-nothing: every hyper-parameter and parameter is checked before anything is
        written, so a step that raises leaves parameters, moments and state["step"] as they
        were (new state, and a new state layout, are only recorded once every update
        succeeded).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group_values = self._group_values()
        # The layout holds the parameters (their ids cannot be reused while it lives): the
        # same ids in the same groups with the same batch hyper-parameters mean the same
        # layout.
        signature = [
            (values[2], tuple(map(id, group["params"])))
            for values, group in zip(group_values, self.param_groups)
        ]
        layout = self._flat_layout
        fresh = layout is None or layout.signature != signature
        if fresh:
            layout = _FlatLayout(self.param_groups, group_values, signature, self.state)
        runs = layout.prepare(self.state, group_values, check_state=not fresh)
        if runs is None:  # user code replaced or removed some state: lay it out again
            layout = _FlatLayout(self.param_groups, group_values, signature, self.state)
            fresh = True
            runs = layout.prepare(self.state, group_values, check_state=False)
        # One native call validates everything before it writes anything; with several
        # calls, a later one must not fail after an earlier one wrote: check what the
        # native layer would reject first.
        if len(runs) > 1:
            for run in runs:
                run.check_and_make_contiguous()
        # On zenflow's own threads, torch's spinning OpenMP team would take their cores; on
        # that team itself (zenflow.host_threads() == "framework") there is nothing to pause.
        if (
            sum(run.elements for run in runs) >= _PAUSE_OPENMP_MIN_ELEMENTS
            and not native().parallel_runtime_is_set()
        ):
            pause_openmp_workers()
        for run in runs:
            run.execute(retry=len(runs) == 1)
        # Every update succeeded: record the layout, the new states and the step counts.
        if fresh:
            layout.commit(self.state)
            self._flat_layout = layout
        for run in runs:
            run.finish(self.state)
        layout.snapshot(self.state)
        return loss

    def _group_values(self) -> list:
        """Per group: validated lr and weight decay, and the hyper-parameters that decide its
        kernel batch. Reused while every group holds the same immutable values (the same
        objects: a scheduler's new lr is a new float), so a steady-state step validates
        nothing twice."""
        keys = [tuple(map(group.get, _GROUP_KEYS)) for group in self.param_groups]
        cached_keys, cached_values = self._group_cache
        if len(keys) == len(cached_keys) and all(
            all(map(is_, key, cached)) for key, cached in zip(keys, cached_keys)
        ):
            return cached_values
        values = []
        for index, group in enumerate(self.param_groups):
            lr = _check_number(f"param_groups[{index}].lr", group["lr"], 0.0)
            wd = _check_number(f"param_groups[{index}].weight_decay", group["weight_decay"], 0.0)
            eps = _check_number(f"param_groups[{index}].eps", group["eps"], 0.0)
            betas = group["betas"]
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"param_groups[{index}].betas: expected a pair, got {betas!r}")
            beta1 = _check_number(f"param_groups[{index}].betas[0]", betas[0], 0.0, 1.0)
            beta2 = _check_number(f"param_groups[{index}].betas[1]", betas[1], 0.0, 1.0)
            mode = ADAM_MODES["adamw" if group["decoupled_weight_decay"] else "adam"]
            scale = -1.0 if group["maximize"] else 1.0
            values.append((lr, wd, (beta1, beta2, eps, mode, scale)))
        # Only values that cannot change in place may be recognised by identity: a tensor lr
        # or a list of betas is validated again at every step.
        immutable = all(
            all(type(v) in _IMMUTABLE_NUMBERS for v in (*key[:3], *key[4:]))
            and type(key[3]) is tuple
            and all(type(b) in _IMMUTABLE_NUMBERS for b in key[3])
            for key in keys
        )
        self._group_cache = (keys, values) if immutable else ((), [])
        return values

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
