"""Digit-generation metrics: judge adherence, reward-classifier probability, judge-feature FD."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.evaluation.classifier import DigitClassifier
from flowpost.core.evaluation.frechet import frechet_distance
from flowpost.core.models.base import ModelAdapter
from flowpost.core.rewards.digit_adherence import label_probability
from flowpost.core.sampling.generate import generate_images


@dataclass(frozen=True)
class EvalPlan:
    """Sample ``i`` uses prompt ``i % len(prompts)`` and noise addressed by (seed, "eval", i)."""

    prompts: list[str]
    labels: list[int]
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


@torch.no_grad()
def digit_metrics(
    images: Tensor,
    labels: Tensor,
    *,
    judge: DigitClassifier,
    reward: DigitClassifier,
    real_images: Tensor,
) -> dict[str, float]:
    """``adherence`` (judge argmax = label), ``reward_mean`` (reward P(label)), ``fd`` (judge features)."""
    judge_logits = judge(images)
    return {
        "adherence": float((judge_logits.argmax(-1) == labels).float().mean()),
        "reward_mean": float(label_probability(reward, images, labels).mean()),
        "fd": frechet_distance(judge.features(images), judge.features(real_images)),
        "n_samples": int(images.shape[0]),
    }
