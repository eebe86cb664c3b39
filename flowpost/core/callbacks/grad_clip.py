"""Gradient-norm clipping before each optimizer step."""

from __future__ import annotations

from flowpost.core.callbacks.base import Callback, TrainerView


class GradClipCallback(Callback):
    def __init__(self, *, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer: TrainerView) -> dict[str, float]:
        norm = trainer.parallel.clip_gradients(trainer.accelerator, trainer.model, self.max_norm)
        return {} if norm is None else {"grad_norm": norm}
