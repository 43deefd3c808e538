"""The engine behind ZenFlowAdamW: which parameters it holds (_Layout), building it for the
current parameter groups, carrying the old engine's state over when the groups change, and
handing it the hyper-parameters of each step. A mixin of ZenFlowAdamW: what the engine is
told, never what it decides (selection, windows, host updates: engine.h).
"""

from __future__ import annotations

from typing import Any

import torch

from ._native import native
from ._state import _fresh_entry, _is_matrix
from .config import engine_config


class _Layout:
    """Which parameters the engine holds, in which order, and each group's engine settings."""

    def __init__(self, param_groups: list[dict]):
        self.params: list[torch.Tensor] = []
        self.frozen: list[torch.Tensor] = []
        self.groups: list[dict] = []
        self.matrix: list[bool] = []
        for group in param_groups:
            indices = []
            for p in group["params"]:
                if not p.requires_grad:
                    self.frozen.append(p)
                    continue
                indices.append(len(self.params))
                self.params.append(p)
                self.matrix.append(_is_matrix(p, bool(group["zenflow"])))
            self.groups.append(
                {
                    "params": indices,
                    "lr": float(group["lr"]),
                    "weight_decay": float(group["weight_decay"]),
                    "dense": not group["zenflow"],
                }
            )
        self.index_of = {id(p): i for i, p in enumerate(self.params)}
        self.grad_bytes = [p.numel() * p.element_size() for p in self.params]
        # add_param_group keeps the parameters all on the CPU or all on CUDA devices. The
        # engine numbers CUDA devices in increasing index (its device() order).
        found = {p.device for p in self.params} or {torch.device("cpu")}
        self.devices = sorted(found, key=lambda d: -1 if d.index is None else d.index)

    @property
    def device(self) -> torch.device:
        """The first device: its type is every parameter's."""
        return self.devices[0]


def _streams(layout: _Layout) -> list[int] | None:
    """The caller's current CUDA stream on each of the parameters' devices (devices() order),
    passed with every engine call that runs work: its kernels then run after the work that
    produced the gradients (the backward, on the caller's stream), and the caller's later
    work runs after them. None for CPU parameters (the host backend has no stream)."""
    if layout.device.type != "cuda":
        return None
    return [torch.cuda.current_stream(device).cuda_stream for device in layout.devices]


def _snapshot(param_groups: list[dict]) -> list[tuple]:
    """What, when it changes, needs a new engine (the engine fixes these at creation). The
    hyper-parameters are not among them: every step hands the engine its values."""
    return [(bool(g["zenflow"]), len(g["params"])) for g in param_groups]


def _hyperparameters(param_groups: list[dict]) -> tuple:
    """(betas, eps, weight decays) of the groups, as the engine takes them: one betas/eps
    pair for every group (engine.h: zf_engine_set_hyperparameters)."""
    first = param_groups[0]
    for g, group in enumerate(param_groups[1:], start=1):
        if tuple(group["betas"]) != tuple(first["betas"]) or group["eps"] != first["eps"]:
            raise ValueError(
                f"param_groups[{g}]: betas and eps must be the same in every group (the engine has "
                f"one pair); got {tuple(group['betas'])}, {group['eps']} against "
                f"{tuple(first['betas'])}, {first['eps']}"
            )
    return (
        tuple(float(b) for b in first["betas"]),
        float(first["eps"]),
        tuple(float(group["weight_decay"]) for group in param_groups),
    )


class _EngineMixin:
    """The engine of ZenFlowAdamW: its creation, its rebuilds and the calls around its step."""

    @staticmethod
    def _make_layout(groups: list[dict]) -> _Layout:
        """The layout of `groups` (for the state-dict mixin, which loads into new groups)."""
        return _Layout(groups)

    def _loss_scaling_mode(self, layout: _Layout) -> str:
        mode = self._settings["loss_scaling"]
        if mode == "auto":
            mode = "dynamic" if any(p.dtype == torch.float16 for p in layout.params) else "none"
        return mode

    def _new_engine(self, layout: _Layout) -> tuple[Any, str]:
        groups = self.param_groups
        _hyperparameters(groups)  # one betas / eps pair
        mode = self._loss_scaling_mode(layout)
        config = self._engine_config(tuple(groups[0]["betas"]), float(groups[0]["eps"]), mode)
        return native().Engine(layout.params, layout.groups, config), mode

    def _engine_config(self, betas: tuple, eps: float, loss_scaling: str) -> dict:
        config = engine_config(self._settings, betas, eps, loss_scaling)
        if self._parallel is not None:
            config["ranks_per_host"] = self._parallel.ranks_per_host
        return config

    def _rebuild_engine(self, state: dict | None = None) -> None:
        """A new engine for the current groups. Its state: `state` (engine format) when
        given, else the current engine's (carried over by parameter identity), with
        fresh state for parameters the old engine did not hold. Nothing changes on failure."""
        layout = _Layout(self.param_groups)
        if state is None and self._engine is not None:
            state = self._carry_over(layout)
        engine = None
        try:
            engine, mode = self._new_engine(layout)
            if self._parallel is not None:
                self._parallel.attach(engine)
            elif layout.device.type == "cuda":
                # From torch's caching allocator, on the current stream of each device; the
                # engine keeps the tensors until it is closed.
                for index, device in enumerate(layout.devices):
                    memory = torch.empty(
                        engine.device_memory_size(index), dtype=torch.uint8, device=device
                    )
                    engine.attach_device_memory(memory, index)
        except BaseException:
            if engine is not None:
                engine.close()
            if state is not None:
                self._refuse_on_every_rank("load")  # the other ranks are in the load's agreement
            raise
        try:
            if state is not None:
                engine.load_state_dict(state, stream=_streams(layout))
        except BaseException:
            engine.close()
            raise
        if self._engine is not None:
            self._engine.close()
        self._engine, self._layout, self._loss_scaling = engine, layout, mode
        self._snapshot = _snapshot(self.param_groups)
        self._hyperparameters = _hyperparameters(self.param_groups)
        self._zero_grads = {}

    def _hand_over_hyperparameters(self) -> None:
        """This step's betas, eps and weight decays, when a scheduler (or the caller) changed
        them: the engine takes them for this step on (no flush, no new engine)."""
        try:
            values = _hyperparameters(self.param_groups)
            if values != self._hyperparameters:
                betas, eps, weight_decays = values
                self._engine.set_hyperparameters(betas, eps, list(weight_decays))
                self._hyperparameters = values
        except BaseException:
            self._refuse_on_every_rank("step")  # refused before this step's agreement
            raise

    def _stream(self) -> list[int] | None:
        """The `stream` of an engine call that runs work: the caller's current one (_streams)."""
        return _streams(self._layout)

    def _carry_over(self, layout: _Layout) -> dict:
        old_layout = self._layout
        old = self._engine_state()
        entries = []
        for i, p in enumerate(layout.params):
            j = old_layout.index_of.get(id(p))
            if j is None:
                entries.append(_fresh_entry(p, layout.matrix[i]))
                continue
            if old_layout.matrix[j] != layout.matrix[i]:
                raise ValueError(
                    "param_groups: a parameter moved between a zenflow group and a dense one "
                    '("zenflow" changed) after it took steps; its per-column step counts cannot '
                    "become one dense count"
                )
            entries.append(old["params"][j])
        return {"params": entries, "schedule": old["schedule"], "loss_scaler": old["loss_scaler"]}

    def _engine_state(self) -> dict:
        """The engine's whole state (nothing flushed): in data parallel, the ranks' partial saves
        summed over the group."""
        saved = self._engine.state_dict(stream=self._stream())
        if self._parallel is not None:
            self._parallel.sum_state(saved)
        return saved

    def _engine_is_stale(self, layout: _Layout) -> bool:
        if _snapshot(self.param_groups) != self._snapshot:
            return True
        return any(p.requires_grad and p.grad is not None for p in layout.frozen)

    def _refuse_on_every_rank(self, call: str) -> None:
        """Data parallel: this rank refuses `call` before reaching the engine; the engine
        makes every rank's `call` fail (engine.h: zf_engine_refuse). Nothing alone."""
        if self._parallel is not None and self._engine is not None:
            self._engine.refuse(call)
