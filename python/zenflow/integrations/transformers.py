"""Hugging Face Trainer with zenflow.ZenFlowAdamW (docs/integrations.md).

    from zenflow.integrations.transformers import ZenFlowCallback

    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    trainer = Trainer(model=model, args=args, train_dataset=train,
                      optimizers=(opt, None),          # Trainer builds the lr scheduler on it
                      callbacks=[ZenFlowCallback()])
    trainer.train()
    trainer.save_model()                             # exact: flushed at the end of training

Trainer steps, clips, saves and evaluates through the optimizer's torch interface. Its
parameters are exact only after `flush()`: the callback flushes where Trainer reads them,
before a checkpoint is written, before an evaluation, and at the end of training. A flush
closes the open window early (the host update of the deferred columns lands at once), so the
steps that follow a flush differ from those of a run that did not flush there (issue 27 is
making checkpoints independent of flushes). `flush_on_save=False` leaves saves alone: the
run then does not depend on where it saves, but a checkpoint's model weights lag by up to
one window (the optimizer's state_dict, saved after them, flushes anyway today).
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
    flush_on_save: flush before each checkpoint is written (the model file then holds the
        exact weights, and resuming from it continues the run that saved there).
    flush_on_evaluate: flush before an evaluation, so it sees the exact weights.
    The end of training always flushes (the final save_model() and evaluate() are exact).
    """

    def __init__(
        self,
        optimizer: ZenFlowAdamW | None = None,
        *,
        flush_on_save: bool = True,
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
