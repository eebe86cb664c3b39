"""TDM: trajectory distribution matching of a frozen teacher into a few-step student.

As DMD2 (``generator`` and ``fake_score`` roles, the real score from the frozen ``teacher``), but
every stage of the student's K-step ODE trajectory is matched, not only its end: the state each step
reaches, re-noised by the linear flow's forward transition to a sigma inside that step, must look
like the teacher's marginal there. The fake score learns those re-noised states, weighted by a
capped SNR and an importance weight of the mixed noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.trainers.distill.distribution_matching import (
    mixed_noise,
    renoise_between,
    tdm_fake_weights,
    tdm_generator_loss,
    x0_from_velocity,
)
from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
from flowpost.core.trainers.distill.draws import UpdateDraws, rows_at
from flowpost.core.trainers.distill.scores import DistributionMatchingArguments
from flowpost.core.trainers.distill.student_states import student_states
from flowpost.core.trainers.rl.rollout import Rollout

INSIDE = 1e-3  # sigma_t is drawn this far inside each step's interval


class TDMArguments(DistributionMatchingArguments):
    """``train:`` of a TDM stage."""

    huber_c: float | None = Field(1e-3, gt=0, description="pseudo-Huber constant of the generator loss; null: L2")
    snr_cap: float = Field(5.0, gt=0, description="the fake-score weight is min(SNR, snr_cap)")
    importance_clip: float = Field(20.0, ge=1, description="the importance weight is clipped to [1/clip, clip]")


class TDMTrainer(DMD2Trainer):
    """DMD2's roles, rollouts and cadence with TDM's per-step re-noising and losses."""

    Arguments = TDMArguments
    args: TDMArguments  # type: ignore[assignment]
    required_trainable_roles: ClassVar[tuple[str, ...]] = DMD2Trainer.required_trainable_roles

    def step_sample(
        self, x: Tensor, sigma: Tensor, sigma_next: Tensor, state: ConditionState, draws: UpdateDraws
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Without gradients: the generator's ``x0`` from ``x`` at ``sigma``, a ``sigma_t`` inside
        ``(sigma_next, sigma)``, the re-noised ``x_t`` and its noise ``zeta``."""
        with torch.no_grad():
            velocity = self.adapter.velocity(x, sigma, state)
            x0 = x0_from_velocity(x, sigma, velocity)
            x_next = x0 + sigma_next.view(-1, *([1] * (x.dim() - 1))) * velocity  # (1 - s') x0 + s' eps_hat
            inside = INSIDE + (1 - 2 * INSIDE) * draws.uniform("sigma", x)
            sigma_t = sigma_next + (sigma - sigma_next) * inside
            zeta = draws.normal("zeta", x)
            return x0, sigma_t, renoise_between(x_next, sigma_next, sigma_t, zeta), zeta

    def fake_score_objective(self, batch: Rollout, tag: str) -> Tensor:
        """The fake score's weighted x0 regression at a re-noised state of a random step per sample."""
        device = self.accelerator.device
        draws = self.draws(batch, tag)
        states, sigmas = student_states(batch, where=f"stages.{self.stage}.sampling")
        step = draws.index("step", states.shape[1])
        x = rows_at(states, step).to(device)
        sigma, sigma_next = sigmas[step].to(device, x.dtype), sigmas[step + 1].to(device, x.dtype)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        x0, sigma_t, x_t, zeta = self.step_sample(x, sigma, sigma_next, state, draws)
        weights = tdm_fake_weights(
            sigma_t, mixed_noise(x_t, x0, sigma_t), zeta, snr_cap=self.args.snr_cap, clip=self.args.importance_clip
        )
        error = (self.scores.fake_x0(x_t, sigma_t, state).float() - x0.float()).pow(2).flatten(1).mean(1)
        return (weights.float() * error).mean()

    def target_x0(self, x_t: Tensor, sigma_t: Tensor, state: ConditionState, negative: ConditionState | None) -> Tensor:
        """The x0 prediction of the distribution the generator is matched to at ``(x_t, sigma_t)``: the teacher's
        (the real score, with its guidance)."""
        return self.scores.real_x0(x_t, sigma_t, state, negative)

    def generator_objectives(self, batch: Rollout, tag: str) -> Iterator[Tensor]:
        """Each of the K steps' distribution-matching loss, divided by K (backpropagated one by one)."""
        device = self.accelerator.device
        states, sigmas = student_states(batch, where=f"stages.{self.stage}.sampling")
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        negative = self.negative_state(len(batch))
        steps = states.shape[1]
        for k in range(steps):
            draws = self.draws(batch, f"{tag}-step-{k}")
            x = states[:, k].to(device)
            sigma = sigmas[k].to(device, x.dtype).expand(len(batch))
            sigma_next = sigmas[k + 1].to(device, x.dtype).expand(len(batch))
            _, sigma_t, x_t, _ = self.step_sample(x, sigma, sigma_next, state, draws)
            with torch.no_grad():  # before the live forward: the teacher swaps into the generator's weights
                real = self.target_x0(x_t, sigma_t, state, negative)
                fake = self.scores.fake_x0(x_t, sigma_t, state)
            x0_live = x0_from_velocity(x, sigma, self.adapter.velocity(x, sigma, state))
            yield tdm_generator_loss(x0_live, real, fake, huber_c=self.args.huber_c).mean() / steps
