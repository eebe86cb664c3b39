"""A weighted sum of reward scorers, keeping each component for logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowpost.core.rewards.base import Reward
from flowpost.errors import FlowpostError


@dataclass(frozen=True)
class RewardOutput:
    """``total`` [B] = sum of weight * component; ``components`` maps names to raw scores [B]."""

    total: Tensor
    components: dict[str, Tensor]


class WeightedRewards:
    """Scores a batch with several rewards and sums them with fixed weights.

    ``where`` is the config path of the reward list, used in error messages.
    """

    def __init__(self, components: list[tuple[Reward, float]], *, where: str = "rewards") -> None:
        if not components:
            raise FlowpostError("at least one reward is needed", where=where)
        seen: set[str] = set()
        for position, (reward, _) in enumerate(components):
            if reward.name in seen:
                raise FlowpostError(
                    f"reward {reward.name!r} is listed twice; each reward may appear once",
                    where=f"{where}.{position}.name",
                )
            seen.add(reward.name)
        self.components = [(reward, float(weight)) for reward, weight in components]
        self.where = where

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> RewardOutput:
        batch = media.shape[0]
        total = torch.zeros(batch, dtype=torch.float32, device=media.device)
        scores: dict[str, Tensor] = {}
        for reward, weight in self.components:
            score = reward(media, prompts, metadata)
            if score.shape != (batch,):
                raise FlowpostError(
                    f"reward {reward.name!r} returned shape {tuple(score.shape)}, expected ({batch},)",
                    where=self.where,
                )
            score = score.detach().to(device=media.device, dtype=torch.float32)
            scores[reward.name] = score
            total = total + weight * score
        return RewardOutput(total=total, components=scores)

    def metrics(self, output: RewardOutput) -> dict[str, float]:
        """``reward/<name>_mean``, ``reward/<name>_std`` (population) per component, ``reward/total_mean``."""
        metrics: dict[str, float] = {}
        for name, score in output.components.items():
            metrics[f"reward/{name}_mean"] = float(score.mean())
            metrics[f"reward/{name}_std"] = float(score.std(correction=0))
        metrics["reward/total_mean"] = float(output.total.mean())
        return metrics
