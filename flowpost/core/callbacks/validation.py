"""Periodic validation: a sample grid of fixed prompts with fixed noise."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from flowpost.core.callbacks.base import Callback
from flowpost.core.evaluation.grid import save_grid
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import inference_sigmas

if TYPE_CHECKING:
    from flowpost.core.models.base import ConditionBatch
    from flowpost.core.trainers.base import BaseTrainer


class ValidationCallback(Callback):
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
        if step % self.every == 0 and trainer.accelerator.is_main_process:
            trainer.callbacks.on_validation_begin(trainer)
            path = self.run(trainer, step)
            trainer.callbacks.on_validation_end(trainer, {"grid": str(path), "step": step})

    @torch.no_grad()
    def run(self, trainer: BaseTrainer, step: int) -> Path:
        adapter = trainer.adapter
        rows = [i for i in range(len(self.prompts)) for _ in range(self.samples_per_prompt)]
        state = adapter.prepare_condition_state(self.conditions.index(rows))
        negative = adapter.prepare_condition_state(self.negative.index([0] * len(rows)))
        noise = addressed_randn(
            adapter.latent_shape,
            seed=trainer.spec.seed,
            stage=f"{trainer.stage}/validation",
            step=0,
            indices=range(len(rows)),
        )
        model = adapter.module()
        was_training = model.training
        model.eval()
        latents = sample_ode(
            adapter,
            noise,
            state,
            inference_sigmas(self.steps, shift=adapter.shift),
            guidance=self.guidance,
            negative=negative,
        )
        model.train(was_training)
        path = self.out_dir / f"step-{step:06d}.png"
        save_grid(adapter.decode(latents), path, nrow=self.samples_per_prompt)
        return path
