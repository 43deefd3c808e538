"""ZenFlowAdamW's checkpoints in torch's layout: the engine's state entries (engine.h:
zf_engine_state_kind) as a torch.optim state dict, whole or sharded (data parallel), and
back; a torch.optim.AdamW state dict loads too. A mixin of ZenFlowAdamW, kept apart from
the step: it only translates between the two layouts.
"""

from __future__ import annotations

from typing import Any

import torch

from ._native import native
from .config import check_hyperparameters
from .distributed import column_range, consolidate_shards

# The engine's checkpoint entries are described by the engine (engine.h:
# zf_engine_param_state_layout): _engine_entries asks it; nothing here copies the schema.
_SCHEDULE_KEYS = (
    "step",
    "window",
    "window_steps",
    "since_selection",
    "selections",
    "has_previous_window",
    "skipped",
    "steps_accumulated",
    "update_pending",
    "warm_up_end",
)
# Absent from a state saved before they existed (and from torch's): left out, and the
# binding gives them the meaning the engine has for such a state (csrc/bind_state.cpp).
_LATER_KEYS = ("steps_accumulated", "update_pending", "warm_up_end")
# torch.optim.AdamW's group flags that have no meaning here, and the values we can honour.
_TORCH_ADAMW_FLAGS = {
    "amsgrad": False,
    "maximize": False,
    "capturable": None,
    "differentiable": False,
    "foreach": None,
    "fused": None,
    "decoupled_weight_decay": True,
}
_STATE_FORMAT = 1


def _columns(p: torch.Tensor) -> int:
    return p.numel() // p.shape[0] if p.dim() >= 2 and p.shape[0] > 0 else 0


def _engine_entries(p: torch.Tensor, matrix: bool) -> dict[str, tuple[torch.dtype, tuple]]:
    """Every entry of the engine's state of one parameter, in the engine's order: name ->
    (dtype, shape), as the engine describes them (a matrix is what the engine calls one:
    two or more dimensions, outside a dense group)."""
    return {
        name: (getattr(torch, dtype), tuple(shape))
        for name, dtype, shape in native().param_state_layout(p, not matrix)
    }


def _is_matrix(p: torch.Tensor, zenflow_group: bool) -> bool:
    """The engine's rule (its state of a matrix has a selection)."""
    return any(
        name == "selected" for name, _, _ in native().param_state_layout(p, not zenflow_group)
    )


def _fresh_entry(
    p: torch.Tensor, matrix: bool, given: dict | None = None
) -> dict[str, torch.Tensor]:
    """The engine's state of a parameter that has not taken a step; entries in `given` are
    taken as they are (only the others are allocated)."""
    entry = dict(given or {})
    for key, (dtype, shape) in _engine_entries(p, matrix).items():
        if key in entry:
            continue
        if key == "master":
            entry[key] = p.detach().to("cpu", torch.float32).contiguous().clone()
        else:
            entry[key] = torch.zeros(shape, dtype=dtype)
    return entry


class _StateDictMixin:
    """state_dict / load_state_dict (whole and sharded) of ZenFlowAdamW."""

    def _torch_indices(self) -> dict[int, int]:
        """torch's numbering of parameters in a state dict: in group order."""
        out: dict[int, int] = {}
        for group in self.param_groups:
            for p in group["params"]:
                out.setdefault(id(p), len(out))
        return out

    def _torch_groups(self, numbering: dict[int, int]) -> list[dict]:
        groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            packed["params"] = [numbering[id(p)] for p in group["params"]]
            groups.append(packed)
        return groups

    @staticmethod
    def _torch_entry_of(entry: dict, p: torch.Tensor) -> dict:
        """One parameter's engine state in torch's layout (a mask for the selection, torch's
        scalar "step")."""
        entry = dict(entry)
        if "selected" in entry:  # indices -> a column mask: one shape whatever k and the selection
            mask = torch.zeros(_columns(p), dtype=torch.bool)
            mask[entry["selected"].long()] = True
            entry["selected"] = mask
        entry["step"] = torch.tensor(float(entry["steps"].max()) if entry["steps"].numel() else 0.0)
        return entry

    def _torch_state(self, saved: dict) -> dict[str, Any]:
        numbering = self._torch_indices()
        state = {
            numbering[id(p)]: self._torch_entry_of(saved["params"][i], p)
            for i, p in enumerate(self._layout.params)
        }
        return self._torch_layout(saved, state, numbering)

    def _torch_layout(
        self, saved: dict, state: dict, numbering: dict[int, int], **zenflow_extra: Any
    ) -> dict[str, Any]:
        """torch's state_dict layout around `state`, with zenflow's schedule and scaler."""
        return {
            "state": state,
            "param_groups": self._torch_groups(numbering),
            "zenflow": {
                "format": _STATE_FORMAT,
                "schedule": dict(saved["schedule"]),
                "loss_scaler": dict(saved["loss_scaler"]),
                **zenflow_extra,
            },
        }

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer state in torch's layout: "state" maps a parameter's index to
        its float32 master, exp_avg, exp_avg_sq (the parameter's shape), per-column int32
        "steps" (a matrix) or one step count, a matrix's "selected" columns as a bool mask
        [n] (one shape whatever the selection, as torch.distributed.checkpoint needs), its
        auto-interval statistics and the open window's "accumulator" (the deferred
        gradients summed so far), plus torch's scalar "step"; "param_groups" as torch's;
        "zenflow" the schedule counters (the open window's and whether a host result waits
        to be applied included) and the loss scaler. The layout does not depend on which
        columns were selected or where the state lived.

        It changes nothing: it waits for the host threads' running work but closes no
        window and applies no pending result, so a run that calls it equals one that does
        not, and a run resumed from it (with the model's parameters saved beside it, loaded
        before or after the optimizer) equals the uninterrupted run, bit for bit. The
        parameters themselves lag by the deferred columns' last window (as they do in the
        run); flush() makes them exact, for an export or an evaluation."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        out = self._torch_state(self._engine_state())
        for hook in self._optimizer_state_dict_post_hooks.values():
            result = hook(self, out)
            if result is not None:
                out = result
        return out

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's part of the state (changing nothing, as state_dict()): its layout, where a
        matrix's master, exp_avg and exp_avg_sq hold only the columns this rank owns
        ([rows, columns it owns]; rank r of N owns columns [r*n/N, (r+1)*n/N) of a matrix of n
        = shape[1:] columns), and so does its accumulator, its "steps" theirs; rank 0's shard also holds the
        dense parameters, the selections and the auto-interval statistics.
        ["zenflow"]["shard"] names the rank, the world size and each matrix's (shape,
        columns), ["ranges"] the columns [first, stop) it holds. No collective moves state
        (every rank calls it: the ranks agree on the save).
        load_sharded_state_dict takes the list of every rank's shard; in a single process the
        one shard holds everything."""
        saved = self._engine.state_dict(stream=self._stream())
        parallel = self._parallel
        rank, world_size = (parallel.rank, parallel.world_size) if parallel else (0, 1)
        numbering = self._torch_indices()
        state: dict[int, dict] = {}
        matrices: dict[int, list] = {}  # index -> [shape, columns]
        ranges: dict[int, list] = {}  # index -> [first, stop): the columns this shard holds
        for i, p in enumerate(self._layout.params):
            index = numbering[id(p)]
            entry = saved["params"][i]
            if not self._layout.matrix[i]:
                if rank == 0:
                    state[index] = self._torch_entry_of(entry, p)
                continue
            rows, columns = p.shape[0], _columns(p)
            lo, hi = column_range(columns, rank, world_size)
            part = {
                key: entry[key].reshape(rows, columns)[:, lo:hi].clone()
                for key in ("master", "exp_avg", "exp_avg_sq", "accumulator")
            }
            part["steps"] = entry["steps"][lo:hi].clone()
            part["step"] = torch.tensor(float(part["steps"].max()) if hi > lo else 0.0)
            if rank == 0:
                extras = self._torch_entry_of(entry, p)
                for key in ("selected", "window_score", "window_energy"):
                    if key in extras:
                        part[key] = extras[key]
            state[index] = part
            matrices[index] = [list(p.shape), columns]
            ranges[index] = [lo, hi]
        shard = {"rank": rank, "world_size": world_size, "matrices": matrices, "ranges": ranges}
        return self._torch_layout(saved, state, numbering, shard=shard)

    @staticmethod
    def consolidate_sharded_state_dict(shards: list[dict[str, Any]]) -> dict[str, Any]:
        """The whole state (state_dict()'s) from every rank's sharded_state_dict(), in any
        order; ValueError when a rank is missing or repeated or the shards are of another
        run. Needs no process group."""
        return consolidate_shards(shards)

    def load_sharded_state_dict(self, shards: list[dict[str, Any]]) -> None:
        """Loads the sharded_state_dict() of every rank of a run (of any world size, in any
        order) as load_state_dict loads a whole state: into any world size or a single
        process."""
        self.load_state_dict(consolidate_shards(shards))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state_dict() of this class (any topk_ratio, thread count or backend) or of
        torch.optim.AdamW (its moments and step; the fp32 master starts from the current
        parameters; the next step selects). Group settings (lr, weight_decay, ...) come from
        the saved groups, as in torch. A state of another model (other group sizes, shapes)
        raises ValueError and changes nothing."""
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        try:
            new_groups, engine_state = self._loaded_state(state_dict)
        except BaseException:
            self._refuse_on_every_rank("load")  # data parallel: every rank refuses it
            raise

        # Build and load a new engine with the loaded groups; only then touch anything.
        previous_groups = [dict(group) for group in self.param_groups]
        for group, merged in zip(self.param_groups, new_groups):
            group.clear()
            group.update(merged)
        try:
            split, self._split = self._split, None
            if split == "open":
                self._engine.abort_step(stream=self._stream())
            self._rebuild_engine(engine_state)
        except BaseException:
            for group, previous in zip(self.param_groups, previous_groups):
                group.clear()
                group.update(previous)
            raise
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def _loaded_state(self, state_dict: Any) -> tuple[list[dict], dict]:
        """The groups and the engine's state of a state_dict() (this class's or
        torch.optim.AdamW's), validated; raises ValueError / TypeError naming what is wrong."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict: expected a dict, got {type(state_dict).__name__}")
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"state_dict: missing {key!r} (not an optimizer state dict)")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"state_dict['param_groups']: {len(saved_groups)} groups, this optimizer has "
                f"{len(self.param_groups)} (the state of another model)"
            )
        saved_index: dict[int, Any] = {}  # id(param) -> its index in the saved state
        new_groups = []
        for g, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"state_dict['param_groups'][{g}]: {len(saved['params'])} parameters, this optimizer's "
                    f"group has {len(group['params'])} (the state of another model)"
                )
            for p, index in zip(group["params"], saved["params"]):
                saved_index[id(p)] = index
            merged = dict(group)
            for key, value in saved.items():
                if key == "params":
                    continue
                if key in _TORCH_ADAMW_FLAGS:
                    allowed = _TORCH_ADAMW_FLAGS[key]
                    if allowed is not None and bool(value) != allowed:
                        raise ValueError(
                            f"state_dict['param_groups'][{g}]['{key}']: {value} is not supported"
                        )
                    continue
                merged[key] = value
            merged["betas"] = tuple(merged["betas"])
            check_hyperparameters(
                merged["lr"],
                merged["betas"],
                merged["eps"],
                merged["weight_decay"],
                f"state_dict['param_groups'][{g}].",
            )
            new_groups.append(merged)

        zenflow_state = state_dict.get("zenflow")
        layout = self._make_layout(new_groups)
        entries = []
        saved_state = state_dict["state"]
        for i, p in enumerate(layout.params):
            index = saved_index[id(p)]
            saved = saved_state.get(index)
            name = f"state_dict['state'][{index}]"
            if saved is None:
                entries.append(_fresh_entry(p, layout.matrix[i]))
            elif zenflow_state is not None:
                entries.append(self._zenflow_entry(saved, p, layout.matrix[i], name))
            else:
                entries.append(self._torch_entry(saved, p, layout.matrix[i], name))
        if zenflow_state is not None:
            saved_schedule = zenflow_state["schedule"]
            schedule = {
                key: int(saved_schedule[key])
                for key in _SCHEDULE_KEYS
                if key in saved_schedule or key not in _LATER_KEYS
            }
            scaler = dict(zenflow_state["loss_scaler"])
        else:
            steps = [int(e["steps"].max()) for e in entries if e["steps"].numel()]
            schedule = {key: 0 for key in _SCHEDULE_KEYS if key not in _LATER_KEYS}
            schedule["step"] = max(steps, default=0)
            scaler = {"scale": self._settings["initial_scale"], "growth_tracker": 0}
        engine_state = {"params": entries, "schedule": schedule, "loss_scaler": scaler}
        return new_groups, engine_state

    @staticmethod
    def _tensor(name: str, value: Any, dtype: torch.dtype, shape: tuple | None) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(value).__name__}")
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"{name}: shape {tuple(value.shape)}, the parameter needs {tuple(shape)} (the state of another model)"
            )
        return value.detach().to("cpu", dtype).contiguous()

    def _zenflow_entry(self, saved: dict, p: torch.Tensor, matrix: bool, name: str) -> dict:
        if not isinstance(saved, dict):
            raise TypeError(f"{name}: expected a dict")
        entry = {}
        for key, (dtype, shape) in _engine_entries(p, matrix).items():
            if key not in saved:
                if key in ("selected", "window_score", "window_energy", "accumulator"):
                    # a parameter that was dense when saved, or a state saved before the
                    # accumulators were part of it (it was flushed): fresh below
                    continue

                raise ValueError(
                    f"{name}: missing {key!r} (the state of another model or optimizer)"
                )
            if key == "selected":
                mask = self._tensor(f"{name}['selected']", saved[key], torch.bool, (_columns(p),))
                entry[key] = mask.nonzero().flatten().to(torch.int32)
                continue
            if key == "steps" and isinstance(saved[key], torch.Tensor):
                _check_step_counts(f"{name}['steps']", saved[key])
            if key == "steps" and matrix and saved[key].numel() == 1:
                entry[key] = (
                    self._tensor(f"{name}['steps']", saved[key], dtype, None)
                    .reshape(1)
                    .expand(shape)
                    .contiguous()
                )  # dense when saved: every column has its count
                continue
            entry[key] = self._tensor(f"{name}[{key!r}]", saved[key], dtype, shape)
        if not matrix and saved["steps"].numel() != 1:
            raise ValueError(
                f"{name}['steps']: per-column step counts of a matrix cannot load into a dense parameter"
            )
        return _fresh_entry(p, matrix, entry)

    def _torch_entry(self, saved: dict, p: torch.Tensor, matrix: bool, name: str) -> dict:
        if "max_exp_avg_sq" in saved:
            raise ValueError(f"{name}: an amsgrad state (max_exp_avg_sq) is not supported")
        for key in ("step", "exp_avg", "exp_avg_sq"):
            if key not in saved:
                raise ValueError(f"{name}: missing {key!r} (not a torch.optim.AdamW state)")
        step = saved["step"]
        step = step.item() if isinstance(step, torch.Tensor) else step
        # NaN and infinities too: int() of them raises errors that name nothing.
        if (
            isinstance(step, bool)
            or not isinstance(step, (int, float))
            or not 0 <= step < _STEP_LIMIT
        ):
            raise ValueError(
                f"{name}['step']: {step!r} is out of range (a step count in [0, 2**31 - 1))"
            )
        step = int(step)
        moments = {
            key: self._tensor(f"{name}[{key!r}]", saved[key], torch.float32, tuple(p.shape))
            for key in ("exp_avg", "exp_avg_sq")
        }
        entry = _fresh_entry(p, matrix, moments)
        entry["steps"].fill_(step)
        return entry


# The engine's Adam step counts are int32 and must leave room for one more step: [0, 2**31 - 1).
_STEP_LIMIT = 2**31 - 1


def _check_step_counts(name: str, value: torch.Tensor) -> None:
    """Refuses counts outside [0, 2**31 - 1) before they are converted to int32, where an int64
    or float count would wrap or truncate into another, valid-looking count."""
    if value.numel() == 0:
        return
    counts = value.detach()
    if counts.is_complex() or counts.dtype == torch.bool:
        raise TypeError(f"{name}: expected integer step counts, got {counts.dtype}")
    bad = ~((counts >= 0) & (counts < _STEP_LIMIT))  # NaN fails both comparisons
    if bool(bad.any()):
        first = counts.flatten()[bad.flatten()][0].item()
        raise ValueError(f"{name}: step count {first!r} is out of range [0, 2**31 - 1)")
