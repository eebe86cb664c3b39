"""Periodic validation grids: fixed prompts, fixed noise, written as ``validation/step-N.png``.

The training loop decides when one is due and fires the callbacks' validation hooks around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.evaluation.grid import save_grid
from flowpost.core.models.base import ModelAdapter
from flowpost.core.sampling.generate import generate_images


@dataclass(frozen=True)
class ValidationGrid:
    """Every ``every`` optimizer steps, a grid of ``samples_per_prompt`` samples of each prompt."""

    every: int
    prompts: list[str]
    conditions: ConditionBatch
    negative: ConditionBatch
    samples_per_prompt: int
    steps: int
    guidance: float
    out_dir: Path

    def due(self, optimizer_step: int) -> bool:
        return optimizer_step % self.every == 0

    @torch.no_grad()
    def generate(self, adapter: ModelAdapter, *, seed: int, stage: str) -> torch.Tensor:
        rows = [i for i in range(len(self.prompts)) for _ in range(self.samples_per_prompt)]
        return generate_images(
            adapter,
            self.conditions.index(rows),
            self.negative,
            indices=range(len(rows)),
            seed=seed,
            stage=f"{stage}/validation",
            steps=self.steps,
            guidance=self.guidance,
        )

    def save(self, images: torch.Tensor, step: int) -> dict[str, Any]:
        """Write the grid of ``step``; the results the validation hooks receive."""
        path = self.out_dir / f"step-{step:06d}.png"
        save_grid(images, path, nrow=self.samples_per_prompt)
        return {"grid": str(path), "step": step}
