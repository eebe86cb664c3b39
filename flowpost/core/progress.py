"""Training progress counters: the only state a resume needs besides weights and optimizer."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

BudgetUnit = Literal["step", "iteration"]
"""What a stage's budget counts: optimizer steps (dataset trainers) or rollout iterations (online trainers)."""


def describe_position(step: int, iteration: int | None = None) -> str:
    """Where a stage stands, as every message says it: ``step 10``, or ``iteration 5 (step 10)`` for a
    trainer that counts rollout iterations. A step is always an optimizer step."""
    return f"step {step}" if iteration is None else f"iteration {iteration} (step {step})"


@dataclass(frozen=True)
class TrainingProgress:
    """Counters of a training stage. Immutable: advance with the ``advanced`` helpers.

    ``optimizer_step`` counts optimizer updates, ``rollout_iteration`` completed
    generation cycles, ``data_epoch`` cleanly exhausted passes over a finite dataset, and
    ``epoch_cursor`` the micro-batches already consumed in the current data epoch.
    """

    optimizer_step: int = 0
    rollout_iteration: int = 0
    data_epoch: int = 0
    epoch_cursor: int = 0

    def after_optimizer_step(self, micro_batches: int) -> TrainingProgress:
        return replace(
            self,
            optimizer_step=self.optimizer_step + 1,
            epoch_cursor=self.epoch_cursor + micro_batches,
        )

    def after_epoch(self) -> TrainingProgress:
        return replace(self, data_epoch=self.data_epoch + 1, epoch_cursor=0)

    def after_rollout(self) -> TrainingProgress:
        return replace(self, rollout_iteration=self.rollout_iteration + 1)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingProgress:
        return cls(**{key: int(data[key]) for key in cls.__dataclass_fields__ if key in data})
