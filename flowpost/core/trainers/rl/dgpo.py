"""DGPO: direct group preference optimisation on the forward process of ODE rollouts.

Each prompt group is one Bradley-Terry comparison: with the per-sample matching errors ``e`` of the
policy and the reference under one shared noise level and noise per group, the group's logit is
``S = beta_dpo / G * sum_j A_j (e_j - e_ref_j)`` and its loss ``-log sigmoid(-S)``. Its gradient is that of
``sg(sigmoid(S)) A_i e_i`` summed over the group (times ``beta_dpo / G``), the form trained here. A fast EMA
of the policy (the ``old`` snapshot) detaches a sample's error once its ratio ``exp(e_old - e)`` leaves the
clip range in the direction its advantage pushes.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import torch
from pydantic import Field, ValidationInfo, field_validator
from torch import Tensor

from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments, whole_groups
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import matching_error, noised, velocity_mse
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.errors import FlowpostError


class DGPOArguments(OnlineArguments):
    """``train:`` of a DGPO stage; ``train_batch_size`` holds whole groups."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    beta_dpo: float = Field(100.0, gt=0, description="scale of the group logit beta_dpo / G sum_j A_j (e_j - e_ref_j)")
    kl_beta: float = Field(0.02, ge=0, description="weight of <(v - v_ref)^2> to the stage's initial weights")
    clip_dsm: bool = Field(True, description="detach errors whose ratio to the fast-EMA old copy leaves the range")
    clip_range: float = Field(1e-2, gt=0, description="epsilon of the ratio exp(e_old - e) range [1 - eps, 1 + eps]")
    train_timesteps: int = Field(4, ge=1, description="sampling-table sigmas trained per group, stratified")
    timestep_range: float = Field(
        0.6, gt=0, le=1, description="trained sigmas are the sampling sigmas >= 1 - timestep_range"
    )
    old_decay_max: float = Field(0.3, ge=0, lt=1, description="largest decay d of the old copy")
    old_decay_ramp: float = Field(1e-3, ge=0, description="d = min(old_decay_max, ramp * k) after k optimizer steps")
    sample_with_old_after: int = Field(
        200, ge=0, description="optimizer steps after which rollouts sample with the old copy (with clip_dsm)"
    )

    @field_validator("train_batch_size")
    @classmethod
    def _whole_groups(cls, size: int, info: ValidationInfo) -> int:
        return whole_groups(size, info.data.get("group_size"), "DGPO compares the samples of a group")

    def sampling_problems(self, sampling: SamplingConfig) -> list[str]:
        if sampling.dynamics != "ode":
            return [
                f"sampling.dynamics: trainer 'dgpo' trains on clean ODE samples (noise level 0); set "
                f"sampling: {{dynamics: ode}} (got {sampling.dynamics!r})"
            ]
        return []


def old_decay(optimizer_steps: int, *, ramp: float, max_decay: float) -> float:
    """The old copy's EMA decay at optimizer step ``k`` (counted from 0): ``min(max_decay, ramp * k)``."""
    return min(max_decay, ramp * optimizer_steps)


def trained_step_span(sigmas: Tensor, timestep_range: float) -> tuple[int, int]:
    """First and last index of the sampling ``sigmas`` (the final 0 excluded) that are ``>= 1 - timestep_range``."""
    eligible = torch.nonzero(sigmas[:-1] >= 1.0 - timestep_range - 1e-3).flatten()
    if len(eligible) == 0:
        return 0, 0
    return int(eligible.min()), int(eligible.max())


def stratified_indices(uniforms: Tensor, low: int, high: int) -> Tensor:
    """One index per stratum of ``linspace(low, high, K + 1)`` (floored); ``uniforms`` [..., K] in [0, 1)."""
    bounds = torch.linspace(low, high, uniforms.shape[-1] + 1).long()
    lower, upper = bounds[:-1], bounds[1:]
    return lower + (uniforms * (upper - lower)).long()


def group_preference_loss(
    errors: Tensor,
    ref_errors: Tensor,
    advantages: Tensor,
    groups: Tensor,
    num_groups: int,
    *,
    beta: float,
    group_size: int,
    old_errors: Tensor | None = None,
    clip_range: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """``mean_i sg(sigmoid(S_g(i))) A_i e_i`` over the [B] rows; the clip mask [B] and the weights [B].

    ``groups`` [B] numbers each row's group densely (0 .. num_groups - 1); ``S_g = beta / group_size * sum_{j in g} A_j
    (sg(e_j) - e_ref_j)``. With ``old_errors`` a row's error is detached where ``A > 0`` and
    ``exp(e_old - e) > 1 + clip_range``, or ``A <= 0`` and ``exp(e_old - e) < 1 - clip_range``.
    """
    if old_errors is not None:
        ratio = torch.exp(old_errors - errors.detach())
        clipped = torch.where(advantages > 0, ratio > 1 + clip_range, ratio < 1 - clip_range)
        errors = torch.where(clipped, errors.detach(), errors)
    else:
        clipped = torch.zeros_like(errors, dtype=torch.bool)
    terms = advantages * beta * (errors.detach() - ref_errors) / group_size
    sums = terms.new_zeros(num_groups).scatter_add(0, groups, terms)
    weights = torch.sigmoid(sums)[groups]
    return (weights * advantages * errors).mean(), clipped, weights


class DGPOTrainer(GenerationTrainer):
    """Group preference optimisation on clean ODE samples against the reference, clipped by the old copy.

    Micro-batches hold whole groups (shuffled as groups); every row of a group is noised with the group's
    noise at the group's ``train_timesteps`` sigmas, both addressed by its group id and pass.
    """

    Arguments = DGPOArguments
    args: DGPOArguments
    captured_snapshots = {Snapshot.REFERENCE: None, Snapshot.OLD: "clip_dsm"}
    whole_groups = True

    def setup(self) -> None:
        args, where = self.args, f"stages.{self.stage}"
        if problems := args.sampling_problems(self.sampling):
            path, _, why = problems[0].partition(": ")
            raise FlowpostError(why, where=f"{where}.{path}")
        self.sigma_table = self.adapter.inference_sigmas(self.sampling.steps)
        self.span = trained_step_span(self.sigma_table, args.timestep_range)
        available = self.span[1] - self.span[0]
        if args.train_timesteps > available:
            raise FlowpostError(
                f"train_timesteps={args.train_timesteps} exceeds the {available} strata between the sampling sigmas "
                f">= 1 - timestep_range ({1 - args.timestep_range:g}); lower it, or raise timestep_range or "
                "sampling.steps",
                where=f"{where}.train.train_timesteps",
            )
        module = self.adapter.module()
        self.adapter.snapshots.capture(Snapshot.REFERENCE, module)
        if args.clip_dsm:
            self.adapter.snapshots.capture(Snapshot.OLD, module)
        self._passes: Counter[int] = Counter()

    def sample(self) -> Rollout:
        args = self.args
        if args.clip_dsm and self.progress.optimizer_step > args.sample_with_old_after:
            with self.adapter.use_snapshot(Snapshot.OLD):
                return self.generate()
        return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        self._passes = Counter()
        return self.train_on_rollout(samples, self.loss)

    def step_optimizer(self, metrics: Metrics, *, micro_batches: int = 0) -> dict[str, float]:
        """The step, then the old copy's EMA move ``old <- d old + (1 - d) live``, ``d`` at the step's index."""
        index = self.progress.optimizer_step
        host = super().step_optimizer(metrics, micro_batches=micro_batches)
        if self.args.clip_dsm:
            decay = old_decay(index, ramp=self.args.old_decay_ramp, max_decay=self.args.old_decay_max)
            self.adapter.snapshots.ema_update(Snapshot.OLD, self.adapter.module(), decay)
            host["old_decay"] = decay
        return host

    def training_points(self, batch: Rollout) -> tuple[Tensor, Tensor]:
        """Sigmas [B, K] and noise [B, ...] of a micro-batch's pass, equal within a group; on the device, in the
        dtype of the latents."""
        groups = batch.group_ids.tolist()
        address = {"seed": self.spec.seed, "stage": self.stage, "step": self.progress.rollout_iteration}
        uniforms, noise = [], []
        for group in groups:
            at = {"indices": [group], **address}
            draw = self._passes[group]
            uniforms.append(addressed_rand((self.args.train_timesteps,), purpose=f"dgpo-timesteps-{draw}", **at))
            noise.append(addressed_randn(self.adapter.latent_shape, purpose=f"dgpo-noise-{draw}", **at))
        steps = stratified_indices(torch.cat(uniforms), *self.span)
        device, dtype = self.accelerator.device, batch.final.dtype
        return self.sigma_table[steps].to(device, dtype), torch.cat(noise).to(device, dtype)

    def _snapshot_velocity(self, name: str, x: Tensor, sigma: Tensor, state: Any) -> Tensor:
        with torch.no_grad(), self.adapter.use_snapshot(name):
            return self.adapter.velocity(x, sigma, state)

    def loss(self, batch: Rollout, scale: float) -> Objective:
        """One micro-batch's DGPO loss, one part per trained sigma; its metrics."""
        assert batch.advantages is not None
        args, device = self.args, self.accelerator.device
        x0 = batch.final.to(device)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        advantages = batch.advantages.to(device, torch.float32)
        distinct, groups = torch.unique(batch.group_ids, return_inverse=True)  # host data: no sync
        groups = groups.to(device)
        sigmas, noise = self.training_points(batch)
        count = sigmas.shape[1]
        totals: Metrics = {}
        for k in range(count):
            sigma = sigmas[:, k]
            x = noised(x0, noise, sigma)
            # snapshots are swapped in place, so their forwards precede the graph of the live one
            v_ref = self._snapshot_velocity(Snapshot.REFERENCE, x, sigma, state)
            v_old = self._snapshot_velocity(Snapshot.OLD, x, sigma, state) if args.clip_dsm else None
            velocity = self.adapter.velocity(x, sigma, state)
            errors = matching_error(velocity, noise, x0)
            policy, clipped, weights = group_preference_loss(
                errors,
                matching_error(v_ref, noise, x0),
                advantages,
                groups,
                len(distinct),
                beta=args.beta_dpo,
                group_size=args.group_size,
                old_errors=None if v_old is None else matching_error(v_old, noise, x0),
                clip_range=args.clip_range,
            )
            kl = velocity_mse(velocity, v_ref).mean()
            loss = policy + args.kl_beta * kl
            step = {
                "loss": loss,
                "policy_loss": policy,
                "kl": kl,
                "matching_error": errors.detach().mean(),
                "group_weight": weights.mean(),
                "clip_fraction": clipped.float().mean(),
            }
            accumulate(totals, step, divisor=count)
            yield loss * (scale / count)
        self._passes.update(set(batch.group_ids.tolist()))
        return totals
