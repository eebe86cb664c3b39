"""Which samples an evaluation draws: prompt rows, seeds and sampler settings."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.base import ModelAdapter
from flowpost.core.sampling.generate import generate_images


@dataclass(frozen=True)
class EvalPlan:
    """Sample ``i`` uses prompt ``i % len(prompts)`` and noise addressed by (seed, "eval", i)."""

    prompts: list[str]
    samples: int
    steps: int
    guidance: float
    seed: int
    batch_size: int

    def rows(self) -> list[int]:
        return [i % len(self.prompts) for i in range(self.samples)]


def generate(adapter: ModelAdapter, plan: EvalPlan, conditions: ConditionBatch, negative: ConditionBatch) -> Tensor:
    """Decoded samples [samples, C, H, W] in [0, 1] on the CPU; ``conditions`` rows align with ``plan.prompts``."""
    return generate_images(
        adapter,
        conditions.index(plan.rows()),
        negative,
        indices=range(plan.samples),
        seed=plan.seed,
        stage="eval",
        steps=plan.steps,
        guidance=plan.guidance,
        batch_size=plan.batch_size,
    )
