"""A weighted sum of reward scorers, keeping each component for logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowpost.core.rewards.base import Reward, compares_groups
from flowpost.errors import FlowpostError


@dataclass(frozen=True)
class RewardOutput:
    """``total`` [B] = sum of weight * component; ``components`` maps names to raw scores [B]."""

    total: Tensor
    components: dict[str, Tensor]

    @staticmethod
    def cat(parts: list[RewardOutput]) -> RewardOutput:
        """The outputs of consecutive batches as one, in order."""
        return RewardOutput(
            total=torch.cat([part.total for part in parts]),
            components={name: torch.cat([part.components[name] for part in parts]) for name in parts[0].components},
        )


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

    @property
    def compares_groups(self) -> bool:
        """Whether a component compares the samples of a group: then a call must hold whole groups."""
        return any(compares_groups(reward) for reward, _ in self.components)

    @property
    def weights(self) -> dict[str, float]:
        """Each reward's weight, by name, in the listed order."""
        return {reward.name: weight for reward, weight in self.components}

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> RewardOutput:
        batch = media.shape[0]
        total = torch.zeros(batch, dtype=torch.float32, device=media.device)
        scores: dict[str, Tensor] = {}
        for position, (reward, weight) in enumerate(self.components):
            score = self._score(position, reward, media, prompts, metadata)
            scores[reward.name] = score
            total = total + weight * score
        return RewardOutput(total=total, components=scores)

    def _score(
        self, position: int, reward: Reward, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> Tensor:
        """One component's ``[B]`` float32 scores; any failure names ``WHERE.N`` and the reward."""
        where, batch = f"{self.where}.{position}", media.shape[0]
        try:
            score = reward(media, prompts, metadata)
        except FlowpostError as exc:  # its own message (a TransientError stays retryable)
            raise type(exc)(f"reward {reward.name!r}: {exc}", where=where) from exc
        except Exception as exc:
            raise FlowpostError(f"reward {reward.name!r} raised {type(exc).__name__}: {exc}", where=where) from exc
        if not isinstance(score, Tensor) or score.shape != (batch,):
            shape = tuple(score.shape) if isinstance(score, Tensor) else type(score).__name__
            raise FlowpostError(f"reward {reward.name!r} returned {shape}, expected ({batch},) scores", where=where)
        score = score.detach().to(device=media.device, dtype=torch.float32)
        if not bool(torch.isfinite(score).all()):
            bad = int((~torch.isfinite(score)).sum())
            raise FlowpostError(f"reward {reward.name!r} returned {bad} non-finite of {batch} scores", where=where)
        return score

    def metrics(self, output: RewardOutput) -> dict[str, float]:
        """``reward/<name>_mean``, ``reward/<name>_std`` (population) per component, ``reward/total_mean``."""
        metrics: dict[str, float] = {}
        for name, score in output.components.items():
            metrics[f"reward/{name}_mean"] = float(score.mean())
            metrics[f"reward/{name}_std"] = float(score.std(correction=0))
        metrics["reward/total_mean"] = float(output.total.mean())
        return metrics
