"""Periodic validation: a sample grid of fixed prompts with fixed noise."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from flowpost.core.callbacks.base import Callback
from flowpost.core.evaluation.grid import save_grid
from flowpost.core.sampling.generate import generate_images

if TYPE_CHECKING:
    from flowpost.core.conditions import ConditionBatch
    from flowpost.core.trainers.base import BaseTrainer


class ValidationCallback(Callback["BaseTrainer"]):
    """Every ``every`` optimizer steps, writes ``validation/step-N.png`` (rank 0)."""

    def __init__(
        self,
        *,
        every: int,
        prompts: list[str],
        conditions: ConditionBatch,
        negative: ConditionBatch,
        samples_per_prompt: int,
        steps: int,
        guidance: float,
        out_dir: Path,
    ) -> None:
        self.every = every
        self.prompts = prompts
        self.conditions = conditions
        self.negative = negative
        self.samples_per_prompt = samples_per_prompt
        self.steps = steps
        self.guidance = guidance
        self.out_dir = out_dir

    def on_step_end(self, trainer: BaseTrainer, metrics: dict[str, float]) -> None:
        step = trainer.progress.optimizer_step
        main = trainer.accelerator.is_main_process
        if step % self.every != 0 or not (main or trainer.parallel.collective_passes):
            return
        if main:
            trainer.callbacks.on_validation_begin(trainer)
        images = self.generate(trainer)  # with sharded weights every rank takes part; rank 0 writes
        if main:
            path = self.save(images, step)
            trainer.callbacks.on_validation_end(trainer, {"grid": str(path), "step": step})

    @torch.no_grad()
    def generate(self, trainer: BaseTrainer) -> torch.Tensor:
        rows = [i for i in range(len(self.prompts)) for _ in range(self.samples_per_prompt)]
        return generate_images(
            trainer.adapter,
            self.conditions.index(rows),
            self.negative,
            indices=range(len(rows)),
            seed=trainer.spec.seed,
            stage=f"{trainer.stage}/validation",
            steps=self.steps,
            guidance=self.guidance,
        )

    def save(self, images: torch.Tensor, step: int) -> Path:
        path = self.out_dir / f"step-{step:06d}.png"
        save_grid(images, path, nrow=self.samples_per_prompt)
        return path
