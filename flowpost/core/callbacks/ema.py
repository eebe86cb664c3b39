"""EMA of the trainable weights, kept as the ``ema`` snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowpost.core.callbacks.base import Callback

if TYPE_CHECKING:
    from flowpost.core.trainers.base import BaseTrainer

EMA_SNAPSHOT = "ema"


def ema_decay(decay: float, updates: int, *, warmup: bool) -> float:
    """The decay for the ``updates``-th update: ``min(decay, (1 + n) / (10 + n))`` with warm-up."""
    return min(decay, (1.0 + updates) / (10.0 + updates)) if warmup else decay


class EMACallback(Callback):
    """Maintains ``snapshots['ema']`` after every optimizer step.

    The snapshot is keyed by the adapter's own network (``adapter.module()``), never by a
    distributed wrapper around it, so its names match what ``use_snapshot`` swaps into.
    """

    def __init__(self, *, decay: float, warmup: bool = True) -> None:
        self.decay = decay
        self.warmup = warmup

    def on_train_start(self, trainer: BaseTrainer) -> None:
        if EMA_SNAPSHOT not in trainer.adapter.snapshots:
            trainer.adapter.snapshots.capture(EMA_SNAPSHOT, trainer.adapter.module())

    def on_step_end(self, trainer: BaseTrainer, metrics: dict[str, float]) -> None:
        decay = ema_decay(self.decay, trainer.progress.optimizer_step, warmup=self.warmup)
        trainer.adapter.snapshots.ema_update(EMA_SNAPSHOT, trainer.adapter.module(), decay)
        metrics["ema_decay"] = decay
