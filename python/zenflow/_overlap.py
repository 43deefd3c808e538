"""ZenFlowAdamW.overlap_backward: backward hooks that tell the engine which gradients are
ready (engine.h: zf_engine_mark_ready). Readiness itself, the runs and their submission,
is the engine's; this mixin only registers the hooks and forwards each gradient.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch


def _refuse_wrapped(model: torch.nn.Module) -> None:
    """overlap_backward takes the module itself: a DistributedDataParallel wrapper would
    reduce the gradients a second time, and FSDP's parameters are flat shards."""
    wrappers = [torch.nn.parallel.DistributedDataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers.append(FullyShardedDataParallel)
        from torch.distributed.fsdp import FSDPModule

        wrappers.append(FSDPModule)
    except ImportError:  # a torch without these
        pass
    for wrapper in wrappers:
        if isinstance(model, wrapper):
            inner = (
                "model.module, with every backward under model.no_sync(), "
                if wrapper is (torch.nn.parallel.DistributedDataParallel)
                else ""
            )
            raise TypeError(
                f"model: a {wrapper.__name__}-wrapped module; overlap_backward needs the module "
                f"itself ({inner}zenflow reduces the gradients itself; see docs/usage.md, data "
                "parallel)"
            )


class _OverlapHandle:
    """What overlap_backward returns: remove() unregisters the hooks."""

    def __init__(self, optimizer: Any, targets: list[torch.Tensor]):
        self._optimizer = optimizer
        self._targets = targets
        self._handles: dict[int, Any] = {}  # id(param) -> its hook's handle
        # Autograd runs the backward of each CUDA device on a thread of its own: with
        # parameters on several devices, hooks arrive from several threads, and the engine
        # is driven by one thread at a time.
        self.lock = threading.Lock()

    def refresh(self) -> None:
        """A hook on every target that requires grad and has none yet: frozen parameters get
        none (torch refuses one), and get it once they start requiring grad (checked at each
        step). All or nothing: a failed registration leaves no new hook behind."""
        added = {}
        try:
            for p in self._targets:
                if p.requires_grad and id(p) not in self._handles and id(p) not in added:
                    added[id(p)] = p.register_post_accumulate_grad_hook(
                        self._optimizer._on_gradient
                    )
        except BaseException:
            for handle in added.values():
                handle.remove()
            raise
        self._handles.update(added)

    def remove(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles = {}
        self._targets = []
        if self._optimizer._overlap_handle is self:
            self._optimizer._overlap_handle = None


class _OverlapMixin:
    """overlap_backward, no_sync and the hook of ZenFlowAdamW."""

    def overlap_backward(self, model: torch.nn.Module | None = None) -> _OverlapHandle:
        """Hands gradients to the engine while backward runs: a post-accumulate-grad hook
        on every parameter of `model` that requires grad (all of this optimizer's parameters
        when None; a frozen one gets its hook at the first step where it requires grad) says
        it is ready, and the engine submits runs of ready parameters of at least
        `bucket_bytes`. step() finishes the step, bit for bit as a plain step(); a parameter
        used twice in one backward (shared weights, reentrant checkpointing) is accumulated
        as autograd does. Returns a handle whose remove() unregisters the hooks. With
        gradient accumulation, run the backward of every micro-batch but the last inside
        `with opt.no_sync():`. Pass the module itself, not a DistributedDataParallel or
        FSDP wrapper (zenflow reduces the gradients itself). With release_gradients=True the
        hooks also free each matrix's `.grad` once the engine has consumed its bucket (about
        one bucket alive at a time; None after backward; a selection step keeps every one
        until step()), and code that reads gradients after backward (a norm for logging,
        torch's clip_grad_norm_) sees only the dense parameters': use max_grad_norm."""
        if self._overlap_handle is not None:
            raise ValueError(
                "overlap_backward: already registered (call remove() on its handle first)"
            )
        ours = {id(p) for group in self.param_groups for p in group["params"]}
        if model is None:
            targets = [p for group in self.param_groups for p in group["params"]]
        else:
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
            _refuse_wrapped(model)
            targets = [p for p in model.parameters() if id(p) in ours]
        handle = _OverlapHandle(self, targets)
        handle.refresh()
        self._overlap_handle = handle
        return handle

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside this block do not hand gradients to the engine (gradient
        accumulation: every micro-batch but the last)."""
        self._no_sync_depth += 1
        try:
            yield
        finally:
            self._no_sync_depth -= 1

    def _on_gradient(self, param: torch.Tensor) -> None:
        handle = self._overlap_handle
        if handle is None:
            return
        with handle.lock:
            if self._no_sync_depth > 0 or self._engine is None:
                return
            i = self._layout.index_of.get(id(param))
            if i is None:
                return
            if self._split is None:
                # The first gradient of this backward opens the split step; when the groups
                # changed, step() rebuilds the engine and takes a plain step instead.
                if self._engine_is_stale(self._layout):
                    self._split = "stale"
                else:
                    self._engine.begin_step(self._learning_rates(), stream=self._stream())
                    self._split = "open"
            if self._split == "open":
                engine = self._engine
                engine.mark_ready(i, self._gradient(param), stream=self._stream())
                if self._settings["release_gradients"]:
                    # The engine holds nothing of these any more: free them during backward.
                    for j in engine.take_released():
                        self._released.add(j)
                        self._layout.params[j].grad = None
