"""TDM-R1: TDM with a runtime reward, through a learned surrogate reward on the student's trajectory.

A third trainable role, the ``surrogate`` (a flow model that starts as the teacher), learns the reward: on
the states of each group's trajectories, re-noised inside a step as TDM re-noises them, its x0 errors
against a reference form DGPO's group preference logit, weighted by the group advantages of the reward.
Its implicit reward ``log p_surrogate / p_teacher`` tilts the distribution the generator is matched to:
``p_teacher (p_surrogate / p_teacher)^w``, whose x0 prediction is ``x0_real + w (x0_surrogate - x0_teacher)``.
TDM's generator and fake-score updates run unchanged against that target; with ``w = 0`` they are TDM's.
The preference reference is a fast EMA of the surrogate (TDM-R1's dynamic reference) or its start weights.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.contracts import ONLINE_EXECUTION_CONTRACT, ExecutionContract
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import whole_groups
from flowpost.core.trainers.distill.distribution_matching import renoise_between, x0_from_velocity
from flowpost.core.trainers.distill.draws import UpdateDraws, rows_at
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR, ScorePair
from flowpost.core.trainers.distill.student_states import student_states
from flowpost.core.trainers.distill.tdm import INSIDE, TDMArguments, TDMTrainer
from flowpost.core.trainers.objective import Metrics, Objective
from flowpost.core.trainers.rl.dgpo import group_preference_loss, old_decay
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.role_plan import RoleUpdatePlan

SURROGATE = "surrogate"


class TDMR1Arguments(TDMArguments):
    """``train:`` of a TDM-R1 stage: TDM's, the surrogate reward's preference loss and its weight in the
    generator's target. ``train_batch_size`` holds whole groups; ``optimizers:`` names a ``surrogate`` entry."""

    execution_contract: ClassVar[ExecutionContract] = ONLINE_EXECUTION_CONTRACT

    group_size: int = Field(4, ge=1, description="samples per prompt compared by the surrogate's group preference")
    reward_weight: float = Field(
        1.0, ge=0, description="w of the target p_teacher (p_surrogate / p_teacher)^w; 0: TDM's generator updates"
    )
    beta_dpo: float = Field(2000.0, gt=0, description="scale of the group logit beta_dpo / G sum_j A_j (e_j - e_ref_j)")
    surrogate_kl: float = Field(
        0.0, ge=0, description="weight of <(x0_surrogate - x0_reference)^2> in the surrogate's loss"
    )
    clip_range: float | None = Field(
        None,
        gt=0,
        description="detach errors whose ratio exp(e_ref - e) to the reference's left [1 - eps, 1 + eps] in the "
        "direction the advantage pushes (DGPO's clip, against the reference); null: off",
    )
    dynamic_reference: bool = Field(
        True, description="the preference reference is a fast EMA of the surrogate (false: its start weights)"
    )
    reference_decay_max: float = Field(0.3, ge=0, lt=1, description="largest decay d of the dynamic reference")
    reference_decay_ramp: float = Field(1e-3, ge=0, description="d = min(reference_decay_max, ramp * k), k updates")

    @field_validator("group_size")
    @classmethod
    def _groups_compare(cls, size: int) -> int:
        if size < 2:
            raise ValueError(f"the surrogate reward compares the samples of a prompt: group_size ({size}) must be >= 2")
        return size

    @field_validator("train_batch_size")
    @classmethod
    def _whole_groups(cls, size: int, info: ValidationInfo) -> int:
        return whole_groups(size, info.data.get("group_size"), "the surrogate compares the samples of a group")


def reward_tilted_x0(real: Tensor, surrogate: Tensor, reference: Tensor, weight: float) -> Tensor:
    """``real + weight (surrogate - reference)``: the x0 prediction of ``p_real (p_surrogate / p_reference)^weight``
    at one noisy state (x0 predictions are affine in the score, and the tilt adds ``weight`` times the score
    difference)."""
    if weight == 0:
        return real
    return real + weight * (surrogate - reference)


def x0_errors(prediction: Tensor, target: Tensor) -> Tensor:
    """Per-sample ``<(prediction - target)^2>`` in fp32."""
    return (prediction.float() - target.float()).pow(2).flatten(1).mean(1)


class TDMR1Trainer(TDMTrainer):
    """TDM's rounds (``ttur`` fake-score updates, one generator update) followed by one surrogate update, per
    micro-batch of whole groups; the generator is matched to the reward-tilted teacher."""

    Arguments = TDMR1Arguments
    args: TDMR1Arguments  # type: ignore[assignment]
    required_trainable_roles: ClassVar[tuple[str, ...]] = (GENERATOR, FAKE_SCORE, SURROGATE)
    captured_snapshots = {Snapshot.TEACHER: None, Snapshot.REFERENCE: "dynamic_reference"}
    whole_groups = True

    def setup(self) -> None:
        super().setup()
        self.plan = RoleUpdatePlan(((FAKE_SCORE, self.args.ttur), (GENERATOR, 1), (SURROGATE, 1)))
        self.unguided = ScorePair(self.adapter, 1.0)  # the teacher without guidance: the surrogate's start
        self.reference = Snapshot.REFERENCE if self.args.dynamic_reference else Snapshot.TEACHER
        if self.args.dynamic_reference:
            with self.adapter.use_component_variant(SURROGATE):
                self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())

    def optimize(self, samples: Rollout) -> Metrics:
        return self.train_roles_on_rollout(
            samples,
            self.plan,
            {FAKE_SCORE: self.fake_score_loss, GENERATOR: self.generator_loss, SURROGATE: self.surrogate_loss},
        )

    def surrogate_x0(self, x: Tensor, sigma: Tensor, state: ConditionState, *, reference: bool = False) -> Tensor:
        """The surrogate's x0 prediction (with gradients), or its reference's (``reference``, without)."""
        with self.adapter.use_component_variant(SURROGATE):
            if not reference:
                return x0_from_velocity(x, sigma, self.adapter.velocity(x, sigma, state))
            with torch.no_grad(), self.adapter.use_snapshot(self.reference):
                return x0_from_velocity(x, sigma, self.adapter.velocity(x, sigma, state))

    def target_x0(self, x_t: Tensor, sigma_t: Tensor, state: ConditionState, negative: ConditionState | None) -> Tensor:
        """The reward-tilted teacher's x0 prediction: ``x0_real + w (x0_surrogate - x0_teacher)``."""
        real = super().target_x0(x_t, sigma_t, state, negative)
        weight = self.args.reward_weight
        if weight == 0:
            return real
        teacher = real if self.args.real_guidance == 1.0 else self.unguided.real_x0(x_t, sigma_t, state, None)
        return reward_tilted_x0(real, self.surrogate_x0(x_t, sigma_t, state), teacher, weight)

    def group_draws(self, batch: Rollout, tag: str) -> UpdateDraws:
        """Draws addressed by group id: every row of a group gets its group's step, sigma and noise."""
        grouped = dataclasses.replace(batch, indices=batch.group_ids)
        return UpdateDraws(self.spec.seed, self.stage, self.progress.rollout_iteration, grouped, f"surrogate-{tag}")

    def surrogate_loss(self, batch: Rollout, scale: float, tag: str) -> Objective:
        """DGPO's group preference loss of the surrogate's x0 errors (against the reference's) at one state of
        each group's trajectories: the state a step reached, re-noised inside the step as TDM does (a step,
        sigma and noise shared within the group), with the trajectory's final sample, whose reward it is, as
        the target."""
        assert batch.advantages is not None
        device = self.accelerator.device
        draws = self.group_draws(batch, tag)
        states, sigmas = student_states(batch, where=f"stages.{self.stage}.sampling")
        step = draws.index("step", states.shape[1] - 1)
        x_next, x0 = rows_at(states, step + 1).to(device), states[:, -1].to(device)
        sigma, sigma_next = sigmas[step].to(device, x0.dtype), sigmas[step + 1].to(device, x0.dtype)
        sigma_t = sigma_next + (sigma - sigma_next) * (INSIDE + (1 - 2 * INSIDE) * draws.uniform("sigma", x0))
        x_t = renoise_between(x_next, sigma_next, sigma_t, draws.normal("zeta", x0))
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        reference_x0 = self.surrogate_x0(x_t, sigma_t, state, reference=True)  # swaps weights: before the graph
        surrogate_x0 = self.surrogate_x0(x_t, sigma_t, state)
        errors, reference = x0_errors(surrogate_x0, x0), x0_errors(reference_x0, x0)
        distinct, groups = torch.unique(batch.group_ids, return_inverse=True)  # host data: no sync
        clip = self.args.clip_range
        loss, clipped, weights = group_preference_loss(
            errors,
            reference,
            batch.advantages.to(device, torch.float32),
            groups.to(device),
            len(distinct),
            beta=self.args.beta_dpo,
            group_size=self.args.group_size,
            old_errors=None if clip is None else reference,
            clip_range=clip or 0.0,
        )
        kl = x0_errors(surrogate_x0, reference_x0).mean()
        total = loss + self.args.surrogate_kl * kl
        yield total * scale
        return {
            "loss": total.detach(),
            "preference_loss": loss.detach(),
            "kl": kl.detach(),
            "x0_error": errors.detach().mean(),
            "group_weight": weights.mean(),
            "clip_fraction": clipped.float().mean(),
        }

    def step_role(self, role: str, metrics: Metrics) -> dict[str, float]:
        """The role's update; after the surrogate's, the dynamic reference's EMA move ``ref <- d ref + (1 - d)
        surrogate`` with ``d`` at the surrogate's update index."""
        index = self.roles[SURROGATE].updates
        host = super().step_role(role, metrics)
        if role == SURROGATE and self.args.dynamic_reference:
            args = self.args
            decay = old_decay(index, ramp=args.reference_decay_ramp, max_decay=args.reference_decay_max)
            with self.adapter.use_component_variant(SURROGATE):
                self.adapter.snapshots.ema_update(Snapshot.REFERENCE, self.adapter.module(), decay)
            host[f"{SURROGATE}/reference_decay"] = decay
        return host
