"""Addressed draws of a distillation update: each sample's noise, sigma and step index depend only on
(seed, stage, rollout iteration, sample index, purpose), so resume and world size change nothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.trainers.rl.rollout import Rollout


@dataclass(frozen=True)
class UpdateDraws:
    """The draws of one update on a micro-batch; ``like`` gives their device and dtype."""

    seed: int
    stage: str
    iteration: int
    batch: Rollout
    tag: str

    def _address(self, purpose: str) -> dict:
        return {
            "seed": self.seed,
            "stage": self.stage,
            "step": self.iteration,
            "indices": self.batch.indices.tolist(),
            "purpose": f"{purpose}-{self.tag}",
        }

    def normal(self, purpose: str, like: Tensor) -> Tensor:
        """Standard normals shaped like ``like``."""
        return addressed_randn(like.shape[1:], **self._address(purpose)).to(like.device, like.dtype)

    def uniform(self, purpose: str, like: Tensor) -> Tensor:
        """Per-sample uniforms [B] in [0, 1) on ``like``'s device and dtype."""
        return addressed_rand((), **self._address(purpose)).to(like.device, like.dtype)

    def index(self, purpose: str, count: int) -> Tensor:
        """Per-sample integers [B] in ``[0, count)`` (on the CPU: they index CPU tables)."""
        uniform = addressed_rand((), **self._address(purpose))
        return (uniform * count).long().clamp(max=count - 1)


def rows_at(states: Tensor, index: Tensor) -> Tensor:
    """``states[b, index[b]]`` for every row ``b`` of ``states`` [B, K, ...]."""
    return states[torch.arange(states.shape[0], device=states.device), index.to(states.device)]
