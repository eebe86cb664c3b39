"""Any reward scorer as a metric: the mean of its scores over the samples, which it also gives one by one."""

from __future__ import annotations

import torch

from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.base import Reward
from flowpost.errors import FlowpostError


class RewardMetric:
    """The mean score of ``reward`` over all samples, scored as one batch."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward
        self.name = reward.name

    def __call__(self, samples: EvalSamples) -> float:
        return float(self.scores(samples).mean())

    def scores(self, samples: EvalSamples) -> torch.Tensor:
        """Each sample's score [N], checked to be one finite number per sample."""
        scores = self.reward(samples.images, samples.prompts, samples.metadata)
        count = samples.images.shape[0]
        if not isinstance(scores, torch.Tensor) or scores.shape != (count,):
            shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise FlowpostError(f"reward {self.name!r} returned {shape}, expected ({count},) scores")
        if not bool(torch.isfinite(scores).all()):
            raise FlowpostError(f"reward {self.name!r} returned non-finite scores")
        return scores
