"""Glue for training frameworks that drive a torch optimizer themselves.

zenflow.ZenFlowAdamW is a torch.optim.Optimizer, so Hugging Face Trainer, Accelerate and
PyTorch Lightning take it as they take torch.optim.AdamW. What they do not know is that its
parameters are exact only after `flush()`: between flushes the deferred columns of a matrix
lag by up to one window (they land at the window's host update).

    zenflow.integrations.flush(optimizer)     flushes the ZenFlowAdamW inside any wrapper
                                              (accelerate's AcceleratedOptimizer, Lightning's
                                              LightningOptimizer): before an export or a save
    zenflow.integrations.transformers         ZenFlowCallback for transformers.Trainer

Recipes for Trainer, Accelerate and Lightning: docs/integrations.md. Nothing here imports a
framework; zenflow.integrations.transformers imports transformers when it is imported.
"""

from __future__ import annotations

from typing import Any

from ..optimizer import ZenFlowAdamW

__all__ = ["flush", "zenflow_optimizers"]


def zenflow_optimizers(optimizer: Any) -> list[ZenFlowAdamW]:
    """The ZenFlowAdamW inside `optimizer`: itself, or the one a framework wrapped (the
    wrappers of accelerate and Lightning keep it in `.optimizer`); [] if there is none."""
    seen = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        if isinstance(optimizer, ZenFlowAdamW):
            return [optimizer]
        optimizer = getattr(optimizer, "optimizer", None)
    return []


def flush(optimizer: Any) -> int:
    """Flushes the ZenFlowAdamW inside `optimizer` (see zenflow_optimizers), so that the
    parameters hold the exact weights; returns how many it flushed (0 for another optimizer).
    A flush closes the open window early: the steps after it differ from a run without it."""
    found = zenflow_optimizers(optimizer)
    for opt in found:
        opt.flush()
    return len(found)
