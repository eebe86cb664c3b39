"""The two scores distribution matching compares, in x0 space: the real one (the frozen teacher
snapshot, with classifier-free guidance) and the fake one (the trainable ``fake_score`` role)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.contracts import ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT, ExecutionContract, Paradigm
from flowpost.core.models.base import ModelAdapter
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.distill.distribution_matching import x0_from_velocity

GENERATOR = "generator"
FAKE_SCORE = "fake_score"


class DistributionMatchingArguments(OnlineArguments):
    """``train:`` shared by the distribution-matching distillers (dmd2, tdm); the roles' learning rates
    are in ``optimizers:``. A rollout of the few-step generator (``sampling.steps``, ODE) feeds one
    round of updates per micro-batch: ``ttur`` fake-score updates, then one generator update."""

    execution_contract: ClassVar[ExecutionContract] = ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT
    paradigm: ClassVar[Paradigm] = Paradigm.DISTILLATION

    group_size: int = Field(1, ge=1)
    ttur: int = Field(5, ge=1, description="fake-score updates per generator update")
    real_guidance: float = Field(1.0, ge=0, description="classifier-free guidance of the teacher (real score)")

    @model_validator(mode="after")
    def _one_pass(self) -> DistributionMatchingArguments:
        if self.gradient_accumulation_steps != 1 or self.inner_epochs != 1:
            raise ValueError("each update steps at once: gradient_accumulation_steps and inner_epochs must be 1")
        return self


@dataclass
class ScorePair:
    """``real_x0`` (teacher snapshot, guidance ``guidance``) and ``fake_x0`` (the fake-score role, no guidance)."""

    adapter: ModelAdapter
    guidance: float

    @torch.no_grad()
    def real_x0(self, x: Tensor, sigma: Tensor, state: ConditionState, negative: ConditionState | None) -> Tensor:
        with self.adapter.use_snapshot(Snapshot.TEACHER):
            velocity = self.adapter.forward(x, sigma, state, guidance=self.guidance, negative=negative)
        return x0_from_velocity(x, sigma, velocity)

    def fake_x0(self, x: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        with self.adapter.use_component_variant(FAKE_SCORE):
            return x0_from_velocity(x, sigma, self.adapter.velocity(x, sigma, state))

    def fake_velocity(self, x: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        with self.adapter.use_component_variant(FAKE_SCORE):
            return self.adapter.velocity(x, sigma, state)
