"""Digit-generation metrics: judge adherence, reward-classifier probability, judge-feature FD."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowpost.core.evaluation.classifier import DigitClassifier
from flowpost.core.evaluation.frechet import frechet_distance
from flowpost.core.models.base import ConditionBatch, ModelAdapter
from flowpost.core.noise import addressed_randn
from flowpost.core.rewards.digit_adherence import label_probability
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import inference_sigmas


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


@torch.no_grad()
def generate(
    adapter: ModelAdapter, plan: EvalPlan, conditions: ConditionBatch, negative: ConditionBatch
) -> Tensor:
    """Decoded samples [samples, C, H, W] in [0, 1]; ``conditions`` rows align with ``plan.prompts``."""
    model = adapter.module()
    model.eval()
    sigmas = inference_sigmas(plan.steps, shift=adapter.shift)
    rows = plan.rows()
    outputs = []
    for start in range(0, plan.samples, plan.batch_size):
        indices = list(range(start, min(start + plan.batch_size, plan.samples)))
        noise = addressed_randn(adapter.latent_shape, seed=plan.seed, stage="eval", step=0, indices=indices)
        state = adapter.prepare_condition_state(conditions.index([rows[i] for i in indices]))
        neg = (
            adapter.prepare_condition_state(negative.index([0] * len(indices)))
            if plan.guidance != 1.0
            else None
        )
        latents = sample_ode(adapter, noise, state, sigmas, guidance=plan.guidance, negative=neg)
        outputs.append(adapter.decode(latents))
    return torch.cat(outputs)


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
