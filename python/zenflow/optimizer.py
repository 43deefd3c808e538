"""zenflow.ZenFlowAdamW: the zenflow engine as a torch.optim optimizer.

Every decision of the pipeline (selection, windows, host updates, overlap, clipping, loss
scaling, checkpoints, readiness) is the engine's (zenflow._C.Engine, docs/design.md section
8). This file only maps torch's optimizer interface onto it: parameter groups to engine
groups, the gradients of a step to one engine call; _engine.py builds and rebuilds the engine
for the groups, _state.py maps torch-style state dicts to the engine's checkpoint, and
_overlap.py backward hooks to its readiness calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable

import torch

from ._deepspeed import check_deepspeed, settings_from_deepspeed
from ._engine import _EngineMixin, _Layout
from ._native import native
from ._overlap import _OverlapHandle, _OverlapMixin
from ._state import _StateDictMixin
from ._stats import format_stats, stall_seconds
from .config import ENGINE_DEFAULTS, check_hyperparameters, check_settings
from .distributed import DataParallel, resolve_group

__all__ = ["ZenFlowAdamW", "format_stats", "stall_seconds"]

_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ZenFlowAdamW(_OverlapMixin, _StateDictMixin, _EngineMixin, torch.optim.Optimizer):
    """AdamW with zenflow's stall-free offload, for custom PyTorch training loops.

    Each step the `topk_ratio` most important columns of every matrix (by the gradient's
    column norm) get AdamW at once; the other columns' gradients are accumulated and applied
    by zenflow's multithreaded CPU AdamW once per window of `update_interval` steps, in the
    background (`overlap_step`). One-dimensional parameters, and every parameter of a group
    with ``"zenflow": False``, are dense: plain AdamW every step. The algorithm, its exact
    cases and the state layout: docs/design.md.

    Use it as any torch optimizer::

        opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        for batch in data:
            loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
        opt.flush()  # the parameters now hold the exact current weights

    Which regime. The first 8 steps run as synchronous offload; then the engine reads the
    Adam moments (`auto_warm_up_rounds`, default 200): a gradient that pointed the same way
    step after step (a model trained from scratch) keeps the start synchronous to step 200,
    mostly noise (a pretrained model) starts the windows at step 9;
    stats()["synchronous_start_steps"] says which, and auto_warm_up_rounds=0 turns it off. A
    deferred column gets one host update per window, standing for the window's steps
    (`window_scaling="sqrt"`: lr * sqrt(S), moments decayed by beta^S; "none" is one plain
    Adam step per window). At the defaults, fine-tuning the demo's models ended +0.70% to
    +0.88% above AdamW's held-out loss, and from scratch (tiny GPT-2- and Llama-style models,
    600 steps, lr 1e-3 and 3e-3) +0.98% to +2.63%; full_warm_up_rounds=300,
    update_interval=2 ended within 0.9% from scratch
    (benchmarks/results/2026-12-06-auto-warm-up.md). A window's host result lands
    `update_lag` (1) steps into the next window; raise it if
    stats()["stall_seconds_window_close"] grows.

    Parameters and groups. Parameters are updated in place and must stay where they are
    (no `.to()` after construction). Each group may have its own `lr` (schedulers from
    torch.optim.lr_scheduler work unchanged: the host update of a window uses the lr of the
    window's last step) and `weight_decay`; `betas` and `eps` are shared by all groups.
    A group's `lr`, `weight_decay`, `betas` and `eps` may change at any step (a scheduler
    that cycles momentum, say): the engine takes the step's values, and a window's host
    update those of its last step; nothing is flushed. `betas` and `eps` must be the same in
    every group. Changing a group's `zenflow` flag, or calling `add_param_group`, takes
    effect at the next step: a new engine is built and given the old one's state (the open
    window and a pending host result included, nothing flushed).
    Parameters that do not require grad are left alone; one that starts requiring grad
    joins (with fresh state) at the first step where it has a gradient. A parameter that
    requires grad but has no gradient in a step (`grad is None`) steps with a zero gradient,
    as DeepSpeed does: its moments decay and weight decay applies; torch.optim.AdamW would
    skip it. A step where no parameter has a gradient does nothing.

    Placement. Parameters on the CPU run on the engine's host backend; parameters on a CUDA
    device run on its CUDA backend (a build of zenflow with CUDA), on the caller's current
    stream, with the engine's device memory taken from torch's caching allocator (so
    `torch.cuda.memory_allocated()` counts it). Parameters on several CUDA devices of one
    process (a model split over GPUs) are one optimizer: the engine runs one pipeline per
    device, each on that device's current stream, and keeps them in lock step (one gradient
    norm and one schedule over all of them). Parameters are all on the CPU or all on CUDA
    devices: a mix raises ValueError naming the first parameter elsewhere. The optimizer
    state (`state_dict()`) lives on the CPU for every placement, so a checkpoint saved on one
    loads on another.

    Precision. float32, bfloat16 and float16 parameters; the optimizer state is float32,
    with an fp32 master copy of low-precision parameters (`master_weights="fp32"`).
    `loss_scaling="auto"` turns on the engine's dynamic loss scaling when a parameter is
    float16: scale the loss with ``opt.scale_loss(loss).backward()``; an overflow step is
    skipped everywhere and the scale backs off, as torch.amp.GradScaler does. With
    `loss_scaling="none"` (the default for float32/bfloat16), torch.amp.GradScaler
    interoperates: ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``
    (GradScaler hands this optimizer its scale and overflow flag; the step unscales the
    gradients, or is skipped on an overflow). Using GradScaler together with zenflow's own
    loss scaling, or with `overlap_backward`, raises ValueError.

    Clipping. `max_grad_norm` clips by the global norm of all gradients, computed in the
    engine's fused statistics pass (no second read); `stats()["last_global_norm"]` is the
    norm before clipping.

    Overlap with backward. ``opt.overlap_backward(model)`` registers post-accumulate-grad
    hooks that hand gradients to the engine in buckets while backward runs; `step()` then
    finishes the step. The result is bit for bit that of a plain `step()`. With gradient
    accumulation, every micro-batch's backward but the last runs inside ``opt.no_sync()``
    (as with DDP), so that only the last one submits.

    Checkpoints. `state_dict()` returns tensors and plain Python values in torch's layout
    ({"state", "param_groups"} plus a "zenflow" entry with the schedule and the loss
    scaler): torch.save and torch.distributed.checkpoint round-trip it. It changes nothing:
    a run that calls it (for a checkpoint, logging, an EMA) equals one that does not, and a
    run resumed from it with the model's own state_dict() (loaded before or after the
    optimizer) equals the uninterrupted run, bit for bit. Between flushes the deferred
    columns of the parameters lag by a window, in the run as in the checkpoint: call
    `flush()` where exact weights are needed (an export, a final evaluation). The state
    loads into an optimizer of the same model with another topk_ratio, thread count, backend
    or world size; a torch.optim.AdamW state dict loads too.

    Data parallel. When torch.distributed is initialised (or `process_group` is given), the
    optimizer is one rank of a data-parallel run over `process_group` (None: the default
    group; a group of one rank: a plain optimizer). Use it on a plain module, not one wrapped
    in DistributedDataParallel: zenflow reduces the gradients itself, in place in `.grad`
    (with DDP they would be reduced twice), or run DDP's backward only under its
    ``no_sync()``. Give each rank the mean loss over its share of the global batch, as with
    DDP: the step follows the sum of the ranks' gradients divided by the world size. All
    ranks select the same columns (the column statistics are all-reduced, one float per
    column); rank r owns the columns [r*n/N, (r+1)*n/N) of every matrix and keeps, moves and
    updates on its host only the deferred ones among them, and the updated columns are all-gathered at upload, so host memory,
    PCIe bytes and host update time per rank drop by N. Construction broadcasts the
    parameters from the group's first rank (as DDP does). gloo groups take CPU parameters,
    NCCL groups CUDA parameters (gloo with CUDA parameters works through host copies of
    every collective: for tests, e.g. ranks sharing one GPU). Every rank calls the same methods in the same order (step,
    flush, state_dict, ...: they run collectives); a step where a rank has no gradient at all
    still steps there (with zeros), so that the ranks stay in step. `overlap_backward` works
    (a data-parallel step starts its work at `step()`). When one rank fails (a bad gradient,
    a host error), every rank raises. torch.amp.GradScaler raises ValueError (each rank's
    scaler would see only its own overflow): use `loss_scaling="dynamic"`. `state_dict()` returns the whole state on every rank;
    `sharded_state_dict()` only this rank's part (its columns of every matrix), and
    `load_sharded_state_dict(shards)` loads the list of every rank's shards; both load into
    any world size, or a single process.

    Threads. `num_threads` host threads run the CPU AdamW and the accumulates (None: the
    cores `pt_reserved_cores_perc` leaves over, at least one). The rest of the cores are
    torch's: with `limit_torch_threads` (the default), construction lowers torch's intra-op
    threads (torch.set_num_threads, process-wide) to that share when it is above it, so the
    background host update never shares a core with torch's spinning OpenMP workers. A
    synchronous configuration (overlap_step=False with update_interval=1, or topk_ratio=1)
    has no background work: torch keeps its threads and the host update takes every core. Call
    `close()` (or drop the optimizer) to join the host threads; interpreter exit joins them.
    """

    # torch.amp.GradScaler: hand us grad_scale / found_inf instead of unscaling gradients
    # itself, so that we can tell it is in use (see step()).
    _step_supports_amp_scaling = True

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        topk_ratio: float = ENGINE_DEFAULTS["topk_ratio"],
        update_interval: int | str = ENGINE_DEFAULTS["update_interval"],
        select_strategy: str = ENGINE_DEFAULTS["select_strategy"],
        select_interval: int | str = ENGINE_DEFAULTS["select_interval"],
        full_warm_up_rounds: int = ENGINE_DEFAULTS["full_warm_up_rounds"],
        overlap_step: bool = ENGINE_DEFAULTS["overlap_step"],
        max_grad_norm: float | None = ENGINE_DEFAULTS["max_grad_norm"],
        auto_ratio: float = ENGINE_DEFAULTS["auto_ratio"],
        max_update_interval: int = ENGINE_DEFAULTS["max_update_interval"],
        master_weights: str = ENGINE_DEFAULTS["master_weights"],
        selection_score: str = ENGINE_DEFAULTS["selection_score"],
        steps_per_epoch: int | None = ENGINE_DEFAULTS["steps_per_epoch"],
        num_threads: int | None = ENGINE_DEFAULTS["num_threads"],
        pt_reserved_cores_perc: float = ENGINE_DEFAULTS["pt_reserved_cores_perc"],
        loss_scaling: str = ENGINE_DEFAULTS["loss_scaling"],
        initial_scale: float = ENGINE_DEFAULTS["initial_scale"],
        growth_factor: float = ENGINE_DEFAULTS["growth_factor"],
        backoff_factor: float = ENGINE_DEFAULTS["backoff_factor"],
        growth_interval: int = ENGINE_DEFAULTS["growth_interval"],
        bucket_bytes: int = ENGINE_DEFAULTS["bucket_bytes"],
        hysteresis: int = ENGINE_DEFAULTS["hysteresis"],
        consecutive_hysteresis: bool = ENGINE_DEFAULTS["consecutive_hysteresis"],
        min_loss_scale: float | None = ENGINE_DEFAULTS["min_loss_scale"],
        update_lag: int | str = ENGINE_DEFAULTS["update_lag"],
        release_gradients: bool = ENGINE_DEFAULTS["release_gradients"],
        window_scaling: str = ENGINE_DEFAULTS["window_scaling"],
        auto_warm_up_rounds: int = ENGINE_DEFAULTS["auto_warm_up_rounds"],
        limit_torch_threads: bool = True,
        process_group: Any = None,
    ):
        check_hyperparameters(lr, betas, eps, weight_decay)
        given = dict(locals())
        group = resolve_group(process_group)
        self._settings = check_settings({key: given[key] for key in ENGINE_DEFAULTS})
        self._engine = None
        self._layout: _Layout | None = None
        self._snapshot: list[tuple] = []
        self._zero_grads: dict[int, torch.Tensor] = {}
        self._overlap_handle: _OverlapHandle | None = None
        self._no_sync_depth = 0
        self._split: str | None = None  # overlap_backward's step: None, "open" or "stale"
        self._released: set[int] = set()  # release_gradients: indices freed in the open step
        self._loss_scaled = False
        self._torch_threads_before: int | None = None  # restored by close()
        if not isinstance(limit_torch_threads, bool):
            raise TypeError(
                f"limit_torch_threads: expected a bool, got {type(limit_torch_threads).__name__}"
            )
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "zenflow": True,
        }
        self._parallel: DataParallel | None = None
        super().__init__(params, defaults)
        if group is not None:
            devices = _Layout(self.param_groups).devices
            if len(devices) > 1:
                raise ValueError(
                    f"params: on {len(devices)} devices ({', '.join(map(str, devices))}); data "
                    "parallel takes the parameters of one device per process"
                )
            self._parallel = DataParallel(group, devices[0])
            self._parallel.broadcast([p for g in self.param_groups for p in g["params"]])
        self._rebuild_engine()
        if limit_torch_threads:
            self._limit_torch_threads()

    def _limit_torch_threads(self) -> None:
        """Applies the engine's thread plan to torch (engine.h: zf_engine_thread_plan_for):
        torch's intra-op threads are lowered to the plan's framework_threads when above it,
        and restored by close(). The engine's host threads run in the background while torch
        computes, and torch's OpenMP workers spin-wait at their barriers, so a core shared by
        both stalls every parallel region of the model (measured: 2 torch threads beside a
        background update on 2 cores made a small model's forward and backward several times
        slower); data-parallel ranks on one host share its cores. A synchronous configuration
        leaves torch every core of the rank."""
        plan = native().engine_thread_plan(self._engine_config((0.9, 0.999), 1e-8, "none"))
        framework = int(plan["framework_threads"])
        if torch.get_num_threads() > framework:
            self._torch_threads_before = torch.get_num_threads()
            torch.set_num_threads(framework)

    @classmethod
    def from_config(cls, params: Iterable, config: Any, **overrides: Any) -> ZenFlowAdamW:
        """An optimizer from a DeepSpeed-style configuration (a dict or a JSON file's path):
        its `zenflow` block (keys and values as DeepSpeed takes them; missing keys take
        DeepSpeed's defaults), its optimizer `params` block (lr, betas, eps, weight_decay),
        `gradient_clipping` (max_grad_norm) and `fp16` (dynamic loss scaling). Keyword
        `overrides` win over the file (for example num_threads or steps_per_epoch)."""
        hyper, settings = settings_from_deepspeed(config)
        for key in overrides:
            if key not in ENGINE_DEFAULTS and key not in (
                "lr",
                "betas",
                "eps",
                "weight_decay",
                "limit_torch_threads",
                "process_group",
            ):
                raise ValueError(f"{key}: unknown ZenFlowAdamW keyword")
        check_deepspeed(hyper, settings, overrides)
        return cls(params, **{**hyper, **settings, **overrides})

    # ---- groups ----

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, plus zenflow's checks (CPU placement, dtype, layout,
        hyper-parameters). A rejected group changes nothing. The engine takes the new group
        at the next step."""
        index = len(self.param_groups)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            where = f"param_groups[{index}]."
            check_hyperparameters(
                group["lr"], group["betas"], group["eps"], group["weight_decay"], where
            )
            if not isinstance(group["zenflow"], bool):
                raise TypeError(
                    f"{where}zenflow: expected a bool, got {type(group['zenflow']).__name__}"
                )
            first = self._first_placed_param(index)
            for j, p in enumerate(group["params"]):
                name = f"param_groups[{index}]['params'][{j}]"
                if first is None:
                    first = (name, p.device)
                elif p.device.type != first[1].type:
                    raise ValueError(
                        f"{name}: on {p.device}, but {first[0]} is on {first[1]}; the parameters "
                        "of a ZenFlowAdamW are all on the CPU or all on CUDA devices"
                    )
                if p.device.type not in ("cpu", "cuda"):
                    raise ValueError(
                        f"{name}: on {p.device}; ZenFlowAdamW takes CPU parameters (the engine's host "
                        "backend) or CUDA parameters (its CUDA backend)"
                    )
                if p.dtype not in _SUPPORTED_DTYPES:
                    raise TypeError(
                        f"{name}: dtype {p.dtype}; expected float32, bfloat16 or float16"
                    )
                if p.layout != torch.strided or not p.is_contiguous():
                    raise ValueError(f"{name}: must be a dense contiguous tensor")
            parallel = getattr(self, "_parallel", None)
            if (
                parallel is not None
                and group["params"]
                and group["params"][0].device != parallel.device
            ):
                raise ValueError(
                    f"param_groups[{index}]: on {group['params'][0].device}, the data-parallel "
                    f"group runs on {parallel.device}"
                )
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise
        if getattr(self, "_parallel", None) is not None:
            self._parallel.broadcast(group["params"])  # joins in the same state on every rank

    def _first_placed_param(self, groups: int) -> tuple[str, torch.device] | None:
        """(name, device) of the first parameter of param_groups[:groups], None if none."""
        for g in range(groups):
            for j, p in enumerate(self.param_groups[g]["params"]):
                return f"param_groups[{g}]['params'][{j}]", p.device
        return None

    def close(self) -> None:
        """Joins the engine's host threads and frees its memory, and gives torch back the
        intra-op threads construction took away (limit_torch_threads); later steps raise."""
        if self._overlap_handle is not None:
            self._overlap_handle.remove()
        if self._engine is not None:
            self._engine.close()
        before, self._torch_threads_before = self._torch_threads_before, None
        if before is not None:
            torch.set_num_threads(before)

    # ---- the step ----

    def _learning_rates(self) -> list[float]:
        return [float(group["lr"]) for group in self.param_groups]

    def _gradient(self, p: torch.Tensor) -> torch.Tensor:
        g = p.grad
        if g is None:
            g = self._zero_grads.get(id(p))
            if g is None:
                g = self._zero_grads[id(p)] = torch.zeros_like(
                    p, memory_format=torch.contiguous_format
                )
            else:
                # Zeroed again at every use: in data parallel the engine reduces gradients in
                # place, so after a step this buffer holds the other ranks' sum, not zeros.
                g.zero_()
        return g

    def _refuse_amp_scaler(self, message: str) -> None:
        """Raises ValueError(message) for a GradScaler step we cannot take. GradScaler deletes
        the attributes it set after a step that returns, not after one that raises: forget
        them first, or the next plain step() would take them for a scaler's."""
        self.__dict__.pop("grad_scale", None)
        self.__dict__.pop("found_inf", None)
        raise ValueError(message)

    def _amp_scaler(self) -> tuple[bool, Any, Any]:
        """(GradScaler in use, its scale or None when already unscaled, its overflow flag)."""
        found_inf = getattr(self, "found_inf", None)
        return found_inf is not None, getattr(self, "grad_scale", None), found_inf

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimizer step with the gradients in `.grad` (or those overlap_backward
        already handed over). Returns closure's loss when a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        split, self._split = self._split, None
        released, self._released = self._released, set()
        self._engine_reached = False
        try:
            self._step(split, released)
        except BaseException:
            if not self._engine_reached:
                # Refused here, before the engine: in data parallel the other ranks are in
                # the step's agreement, and must fail too instead of waiting for this one.
                self._refuse_on_every_rank("step")
            if split == "open" and self._engine is not None:
                self._engine.abort_step(stream=self._stream())
            raise
        finally:
            self._loss_scaled = False
        if self._overlap_handle is not None:
            self._overlap_handle.refresh()  # parameters that started requiring grad
        return loss

    def _step(self, split: str | None, released: set[int]) -> None:
        if self._engine is not None:
            # The engine refuses a capturing stream (a CUDA graph) with the reason: let it say
            # so before anything below synchronises (GradScaler's found_inf.item()).
            self._engine.set_streams(self._stream())
        using_scaler, grad_scale, found_inf = self._amp_scaler()
        if using_scaler:
            if self._loss_scaling == "dynamic":
                self._refuse_amp_scaler(
                    "torch.amp.GradScaler: zenflow's own dynamic loss scaling is on (float16 parameters "
                    "or loss_scaling='dynamic'); use opt.scale_loss(loss) without GradScaler, or "
                    "loss_scaling='none' with GradScaler"
                )
            if split is not None or self._overlap_handle is not None:
                self._refuse_amp_scaler(
                    "torch.amp.GradScaler with overlap_backward: the gradients were handed to the engine "
                    "before GradScaler could unscale them; use loss_scaling='dynamic' and opt.scale_loss(loss)"
                )
            if self._parallel is not None:
                # Each rank's GradScaler sees only its own gradients' overflow, and would back
                # its scale off alone: the ranks' scales and skipped steps would part.
                self._refuse_amp_scaler(
                    "torch.amp.GradScaler: not supported in data parallel (each rank's scaler sees "
                    "only its own overflow); use loss_scaling='dynamic' and opt.scale_loss(loss), "
                    "which all ranks agree on"
                )
            if found_inf.item() != 0:
                return  # GradScaler's overflow: skip the step, as torch's optimizers do
        elif self._loss_scaling == "dynamic" and not self._loss_scaled:
            raise ValueError(
                "loss_scaling: dynamic loss scaling is on (float16 parameters); scale the loss with "
                "opt.scale_loss(loss).backward() before step()"
            )

        layout = self._layout
        self._engine_reached = True  # from here on, every refusal is the engine's own
        if self._engine_is_stale(layout):
            if released:
                raise ValueError(
                    "param_groups: changed during a backward whose gradients the engine already "
                    "released (release_gradients); the step was not taken"
                )
            if split == "open":
                self._engine.abort_step(stream=self._stream())
            split = None
            self._rebuild_engine()
            layout = self._layout
        self._hand_over_hyperparameters()
        grads = []
        missing = 0
        for index, p in enumerate(layout.params):
            g = p.grad
            if index in released:
                g = None  # released in backward: the engine does not read it
            elif g is None:
                g = self._gradient(p)
                missing += 1
            grads.append(g)
        if split == "open":
            # The engine submits what the hooks did not, and retakes the step whole if a
            # gradient grew after its submit (a parameter used twice in backward).
            self._engine.end_step_with(grads, stream=self._stream())
            return
        if grads and missing == len(grads) and self._parallel is None:
            # No gradient at all: nothing to do, as torch's optimizers. In data parallel the
            # other ranks may have some: step with zeros, as they do.
            return
        if grad_scale is not None:
            inverse = grad_scale.double().reciprocal().float()
            torch._foreach_mul_([p.grad for p in layout.params if p.grad is not None], inverse)
        self._engine.step(grads, self._learning_rates(), stream=self._stream())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad. A step that overlap_backward opened and step() did not finish
        (a backward that raised) is discarded first: the engine is as before it."""
        split, self._split = self._split, None
        self._released = set()
        if split == "open":
            self._engine.abort_step(stream=self._stream())
        super().zero_grad(set_to_none=set_to_none)

    # ---- loss scaling ----

    @property
    def loss_scale(self) -> float:
        """The engine's current loss scale (1.0 without dynamic loss scaling)."""
        return self._engine.loss_scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """loss times the current loss scale: call backward() on the result. Needed before
        every step when dynamic loss scaling is on; harmless (a multiply by 1) otherwise."""
        self._loss_scaled = True
        if self._loss_scaling != "dynamic":
            return loss
        return loss * self._engine.loss_scale

    # ---- state ----

    def flush(self) -> None:
        """Applies every pending host update: afterwards the parameters hold the exact
        current weights and the host threads are idle."""
        self._engine.flush(stream=self._stream())

    def stats(self) -> dict[str, Any]:
        """The engine's counters (steps, windows, stalls, bytes moved, ...) and the loss
        scale; zenflow.format_stats() makes a log line of it."""
        out = dict(self._engine.stats())
        out["loss_scale"] = self._engine.loss_scale
        return out
