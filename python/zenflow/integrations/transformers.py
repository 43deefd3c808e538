"""Hugging Face Trainer with zenflow.ZenFlowAdamW (docs/integrations.md).

    from zenflow.integrations.transformers import ZenFlowCallback

    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    trainer = Trainer(model=model, args=args, train_dataset=train,
                      optimizers=(opt, None),          # Trainer builds the lr scheduler on it
                      callbacks=[ZenFlowCallback()])
    trainer.train()
    trainer.save_model()                             # exact: flushed at the end of training

Trainer steps, clips, saves and evaluates through the optimizer's torch interface. Its
parameters are exact only after `flush()` (between flushes the deferred columns lag by up
to one window). A flush closes the open window early, so the steps after it differ from
those of a run that did not flush there; a checkpoint does not: the optimizer's state_dict
holds the open window, and resuming from a checkpoint continues the uninterrupted run bit
for bit (whether Trainer loads the model before or after the optimizer). So the callback
flushes only where the weights are read for themselves: before an evaluation and at the end
of training (the final save_model() and evaluate() are exact). `flush_on_save=True` also
flushes before each checkpoint, so that the checkpoint's model file holds the exact weights
(for a checkpoint used as a model, not only to resume), at the price of a run that depends
on where it saves.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ..optimizer import ZenFlowAdamW
from . import zenflow_optimizers

__all__ = ["ZenFlowCallback"]


class ZenFlowCallback(TrainerCallback):
    """Flushes ZenFlowAdamW wherever Trainer needs the exact weights.

    optimizer: the ZenFlowAdamW to flush (None: the one Trainer hands its callbacks).
    flush_on_save: flush before each checkpoint is written, so that its model file holds the
        exact weights (default False: a resume is exact either way, and without the flush
        the run does not depend on where it saves).
    flush_on_evaluate: flush before an evaluation, so it sees the exact weights.
    The end of training always flushes (the final save_model() and evaluate() are exact).
    """

    def __init__(
        self,
        optimizer: ZenFlowAdamW | None = None,
        *,
        flush_on_save: bool = False,
        flush_on_evaluate: bool = True,
    ):
        if optimizer is not None and not isinstance(optimizer, ZenFlowAdamW):
            raise TypeError(
                f"optimizer: expected a zenflow.ZenFlowAdamW or None, got {type(optimizer).__name__}"
            )
        for name, value in (
            ("flush_on_save", flush_on_save),
            ("flush_on_evaluate", flush_on_evaluate),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
        self.optimizer = optimizer
        self.flush_on_save = flush_on_save
        self.flush_on_evaluate = flush_on_evaluate
        self.flushes = 0  # how many flushes this callback made (for logs and tests)

    def _flush(self, kwargs: dict) -> None:
        targets = [self.optimizer] if self.optimizer is not None else []
        if not targets:
            targets = zenflow_optimizers(kwargs.get("optimizer"))
        for optimizer in targets:
            optimizer.flush()
            self.flushes += 1

    def _before_save_or_evaluate(self, control: Any, kwargs: dict) -> None:
        # Trainer's flow callback has decided this step's save and evaluation by now, and
        # both happen right after the step and epoch callbacks return.
        if (self.flush_on_save and control.should_save) or (
            self.flush_on_evaluate and control.should_evaluate
        ):
            self._flush(kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        self._before_save_or_evaluate(control, kwargs)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        self._before_save_or_evaluate(control, kwargs)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._flush(kwargs)
        return control
