"""Gradient-norm clipping before each optimizer step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowpost.core.callbacks.base import Callback

if TYPE_CHECKING:
    from flowpost.core.trainers.base import BaseTrainer


class GradClipCallback(Callback["BaseTrainer"]):
    def __init__(self, *, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer: BaseTrainer) -> dict[str, float]:
        norm = trainer.parallel.clip_gradients(trainer.accelerator, trainer.model, self.max_norm)
        return {} if norm is None else {"grad_norm": norm}
