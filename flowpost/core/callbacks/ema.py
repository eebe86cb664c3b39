"""EMA of the trainable weights, kept as the ``ema`` snapshot."""

from __future__ import annotations

from typing import Literal

from flowpost.core.callbacks.base import Callback, TrainerView
from flowpost.core.snapshots import Snapshot

EMASchedule = Literal["warmup", "constant", "power", "linear"]


def ema_decay(
    decay: float, updates: int, schedule: EMASchedule = "warmup", *, warmup_steps: int = 100, power: float = 2 / 3
) -> float:
    """The decay of the ``n``-th update (``n = updates``), capped at ``decay``.

    ``warmup``: ``(1 + n) / (10 + n)`` (Flow-GRPO's); ``constant``: ``decay``; ``power``:
    ``1 - (1 + n) ** -power`` (diffusers' EMAModel with inv_gamma 1); ``linear``: ``decay * n / warmup_steps``
    until ``warmup_steps``.
    """
    if schedule == "warmup":
        return min(decay, (1.0 + updates) / (10.0 + updates))
    if schedule == "power":
        return min(decay, 1.0 - (1.0 + updates) ** -power)
    if schedule == "linear":
        return decay * min(1.0, updates / warmup_steps)
    return decay


class EMACallback(Callback):
    """Maintains the ``ema`` snapshot (``Snapshot.EMA``) after every optimizer step.

    The snapshot is keyed by the adapter's own network (``adapter.module()``), never by a
    distributed wrapper around it, so its names match what ``use_snapshot`` swaps into.
    """

    def __init__(
        self, *, decay: float, schedule: EMASchedule = "warmup", warmup_steps: int = 100, power: float = 2 / 3
    ) -> None:
        self.decay = decay
        self.schedule: EMASchedule = schedule
        self.warmup_steps = warmup_steps
        self.power = power

    def on_train_start(self, trainer: TrainerView) -> None:
        if Snapshot.EMA not in trainer.adapter.snapshots:
            trainer.adapter.snapshots.capture(Snapshot.EMA, trainer.adapter.module())

    def on_step_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        decay = ema_decay(
            self.decay, trainer.progress.optimizer_step, self.schedule, warmup_steps=self.warmup_steps, power=self.power
        )
        trainer.adapter.snapshots.ema_update(Snapshot.EMA, trainer.adapter.module(), decay)
        metrics["ema_decay"] = decay
