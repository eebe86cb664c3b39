"""DMD2: distribution matching distillation of a frozen teacher into a few-step generator.

Two trainable roles: the ``generator`` (the few-step student; it owns the base weights) and the
``fake_score`` (a flow model of the generator's current outputs). The real score is the frozen
``teacher`` snapshot with classifier-free guidance. The generator's samples, noised at a random
sigma, are pushed along ``x0_fake - x0_real``: the reverse-KL gradient between the generator's
distribution and the teacher's. Backward simulation: the generator update starts from a state its
own (stored, gradient-free) rollout reached at a random step. No rewards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT, ConditionState
from flowpost.core.trainers.distill.distribution_matching import (
    dmd_generator_loss,
    dmd_gradient,
    uniform_sigmas,
    x0_from_velocity,
)
from flowpost.core.trainers.distill.draws import UpdateDraws, rows_at
from flowpost.core.trainers.distill.scores import (
    FAKE_SCORE,
    GENERATOR,
    DistributionMatchingArguments,
    ScorePair,
)
from flowpost.core.trainers.distill.student_states import student_states
from flowpost.core.trainers.distill.teacher import TEACHER
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import flow_matching_loss, noised
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.role_plan import RoleUpdatePlan
from flowpost.errors import FlowpostError


class DMD2Arguments(DistributionMatchingArguments):
    """``train:`` of a DMD2 stage (the paper's optional regression and GAN terms are not implemented)."""

    sigma_range: tuple[float, float] = Field(
        (0.02, 0.98), description="the fake-score training sigmas and the perturbation sigmas are uniform here"
    )

    @model_validator(mode="after")
    def _sigmas_inside(self) -> DMD2Arguments:
        low, high = self.sigma_range
        if not 0 < low < high < 1:
            raise ValueError(f"sigma_range {self.sigma_range} must satisfy 0 < low < high < 1")
        return self


class DMD2Trainer(GenerationTrainer):
    """Per micro-batch of the generator's rollout: ``ttur`` fake-score updates, then one generator update."""

    Arguments = DMD2Arguments
    args: DMD2Arguments
    required_trainable_roles: ClassVar[tuple[str, ...]] = (GENERATOR, FAKE_SCORE)
    keeps_rollout_states = True

    def setup(self) -> None:
        where = f"stages.{self.stage}.sampling"
        if self.sampling.dynamics != "ode" or self.sampling.window is not None:
            raise FlowpostError(
                "the few-step generator samples with the ODE over all its steps; set dynamics: ode and no window",
                where=where,
            )
        self.adapter.snapshots.capture(TEACHER, self.adapter.module())  # model.init is checked at load
        self.scores = ScorePair(self.adapter, self.args.real_guidance)
        self.plan = RoleUpdatePlan(((FAKE_SCORE, self.args.ttur), (GENERATOR, 1)))
        conditions = self.inputs.require("conditions", where=f"stages.{self.stage}.data")
        self.null = conditions.lookup([NULL_PROMPT]) if self.args.real_guidance != 1.0 else None

    def sample(self) -> Rollout:
        return self.generate()

    def optimize(self, samples: Rollout) -> dict[str, float]:
        return self.train_roles_on_rollout(
            samples, self.plan, {FAKE_SCORE: self.fake_score_loss, GENERATOR: self.generator_loss}
        )

    def draws(self, batch: Rollout, tag: str) -> UpdateDraws:
        return UpdateDraws(self.spec.seed, self.stage, self.progress.rollout_iteration, batch, tag)

    def fake_score_loss(self, batch: Rollout, scale: float, tag: str) -> dict[str, float]:
        """Backpropagate ``fake_score_objective`` times ``scale``; its metrics."""
        loss = self.fake_score_objective(batch, tag)
        self.backward(loss * scale)
        return {"loss": float(loss.detach())}

    def generator_loss(self, batch: Rollout, scale: float, tag: str) -> dict[str, float]:
        """Backpropagate each of ``generator_objectives`` times ``scale``; their summed value."""
        total = 0.0
        for loss in self.generator_objectives(batch, tag):
            self.backward(loss * scale)
            total += float(loss.detach())
        return {"loss": total}

    def negative_state(self, rows: int) -> ConditionState | None:
        """The null-prompt condition state for the teacher's guidance (None without guidance)."""
        if self.null is None:
            return None
        return self.adapter.prepare_condition_state(self.null.index([0] * rows).to(self.accelerator.device))

    def fake_score_objective(self, batch: Rollout, tag: str) -> Tensor:
        """Flow matching of the fake score on the generator's (detached) samples at fresh noise and sigma."""
        device = self.accelerator.device
        x0 = batch.final.to(device)
        draws = self.draws(batch, tag)
        noise = draws.normal("fake-noise", x0)
        sigma = uniform_sigmas(draws.uniform("fake-sigma", x0), *self.args.sigma_range)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        return flow_matching_loss(self.scores.fake_velocity(noised(x0, noise, sigma), sigma, state), noise, x0)

    def generator_objectives(self, batch: Rollout, tag: str) -> Iterator[Tensor]:
        """The distribution-matching loss of the generator's prediction from a random rollout state.

        Each yielded loss must be backpropagated before the next is asked for (the teacher swaps into
        the generator's weights in place)."""
        device = self.accelerator.device
        draws = self.draws(batch, tag)
        states, sigmas = student_states(batch, where=f"stages.{self.stage}.sampling")
        step = draws.index("step", states.shape[1])
        x = rows_at(states, step).to(device)
        sigma_k = sigmas[step].to(device, x.dtype)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        with torch.no_grad():  # the target first: the teacher swaps into the generator's weights
            x0 = x0_from_velocity(x, sigma_k, self.adapter.velocity(x, sigma_k, state))
            noise = draws.normal("noise", x0)
            sigma = uniform_sigmas(draws.uniform("sigma", x0), *self.args.sigma_range)
            x_t = noised(x0, noise, sigma)
            real = self.scores.real_x0(x_t, sigma, state, self.negative_state(len(batch)))
            fake = self.scores.fake_x0(x_t, sigma, state)
            gradient = dmd_gradient(x0, real, fake)
        x0_live = x0_from_velocity(x, sigma_k, self.adapter.velocity(x, sigma_k, state))
        yield dmd_generator_loss(x0_live, x0 - gradient).mean()
