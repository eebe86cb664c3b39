"""AWM (Advantage Weighted Matching): PPO-clip on a time-weighted flow-matching likelihood surrogate."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import matching_error, noised, velocity_mse
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.rl.grpo import ppo_clip_loss
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.errors import FlowpostError

Weighting = Literal["uniform", "t", "t2", "huber", "ghuber"]


class AWMArguments(OnlineArguments):
    """``train:`` of an AWM stage."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    weighting: Weighting = Field("ghuber", description="time weighting w(l, t) of the matching error l")
    ghuber_power: float = Field(0.25, gt=0, description="p of the ghuber weighting")
    clip_range: float = Field(1e-2, gt=0, description="PPO clip epsilon on the per-timestep likelihood ratio")
    advantage_scale: float = Field(1.0, gt=0, description="A~ = advantage_scale * clip(A, +-Amax) / Amax")
    train_timesteps: int = Field(6, ge=1, description="stratified sampling-step sigmas trained per sample")
    timestep_fraction: float = Field(
        0.9, gt=0, le=1, description="train step indices in [1, int(steps * fraction)) of the sigma table"
    )
    kl_beta: float = Field(0.0, ge=0, description="weight of <(v - v_ref)^2> to the stage's initial weights")
    ema_kl_beta: float = Field(0.0, ge=0, description="weight of <(v - v_anchor)^2> to the lagged EMA anchor")
    ema_anchor_decay: float = Field(0.3, ge=0, lt=1, description="largest anchor decay d")
    ema_anchor_ramp: float = Field(0.001, ge=0, description="d = min(ema_anchor_decay, ramp * optimizer steps)")


def weighted_error(error: Tensor, sigma: Tensor, weighting: Weighting, power: float = 0.25) -> Tensor:
    """``w(l, t)``: the matching error ``l`` [B] at noise level ``sigma`` [B] under ``weighting``."""
    if weighting == "uniform":
        return error
    if weighting == "t":
        return sigma * error
    if weighting == "t2":
        return sigma**2 * error
    if weighting == "huber":
        return sigma * (torch.sqrt(error + 1e-10) - 1e-5)
    if weighting == "ghuber":
        return sigma / power * ((error + 1e-10) ** power - 1e-10**power)
    raise ValueError(f"unknown weighting {weighting!r}")


def stratified_step_indices(uniforms: Tensor, num_steps: int, fraction: float) -> Tensor:
    """One sigma-table index per stratum of ``[1, int(num_steps * fraction))``; ``uniforms`` [B, K] in [0, 1).

    The strata are ``floor`` of ``K + 1`` evenly spaced boundaries, so index 0 (pure noise) is never drawn.
    """
    bounds = torch.linspace(1, int(num_steps * fraction), uniforms.shape[-1] + 1).long()
    lower, upper = bounds[:-1], bounds[1:]
    return lower + (uniforms * (upper - lower)).long()


def anchor_decay(optimizer_steps: int, *, ramp: float, max_decay: float) -> float:
    """The anchor's EMA decay after ``optimizer_steps`` steps: ``min(max_decay, ramp * k)``."""
    return min(max_decay, ramp * optimizer_steps)


class AWMTrainer(GenerationTrainer):
    """Advantage-weighted flow matching on clean rollout samples, with ratios to the sampling policy.

    ``log p~ = -w(l, t)`` at ``train_timesteps`` addressed (sigma, noise) points per sample; the
    sampling policy's values are computed once per iteration before any update.
    """

    Arguments = AWMArguments
    args: AWMArguments
    captured_snapshots = {Snapshot.REFERENCE: "kl_beta", Snapshot.ANCHOR: "ema_kl_beta"}
    _first_ratio_error: Tensor | None = None

    def setup(self) -> None:
        args, steps = self.args, self.sampling.steps
        available = int(steps * args.timestep_fraction) - 1
        if args.train_timesteps > available:
            raise FlowpostError(
                f"train_timesteps={args.train_timesteps} exceeds the {max(available, 0)} sampling steps in "
                f"[1, int({steps} * {args.timestep_fraction})); lower it or raise sampling.steps",
                where=f"stages.{self.stage}.train.train_timesteps",
            )
        self.sigma_table = self.adapter.inference_sigmas(steps)
        self.old_log_probs: dict[int, Tensor] = {}
        if args.kl_beta > 0:
            self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())
        if args.ema_kl_beta > 0:
            self.adapter.snapshots.capture(Snapshot.ANCHOR, self.adapter.module())

    def sample(self) -> Rollout:
        return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        self.old_log_probs = self.sampling_log_probs(samples)
        self._first_ratio_error = None
        metrics = self.train_on_rollout(samples, lambda batch, scale: self.awm_loss(batch, scale=scale))
        first = self._first_ratio_error
        return metrics | {"on_policy_ratio_error": 0.0 if first is None else first}

    def _after_acquisition_cycle(self) -> dict[str, float]:
        args = self.args
        if args.ema_kl_beta > 0:
            decay = anchor_decay(
                self.progress.optimizer_step, ramp=args.ema_anchor_ramp, max_decay=args.ema_anchor_decay
            )
            self.adapter.snapshots.ema_update(Snapshot.ANCHOR, self.adapter.module(), decay)
        return {}

    def training_points(self, batch: Rollout) -> tuple[Tensor, list[Tensor]]:
        """Per-sample sigmas [B, K] and noises K x [B, ...], addressed by (iteration, global index, slot)."""
        args, device = self.args, self.accelerator.device
        address = {
            "seed": self.spec.seed,
            "stage": self.stage,
            "step": self.progress.rollout_iteration,
            "indices": batch.indices.tolist(),
        }
        uniforms = addressed_rand((args.train_timesteps,), purpose="awm-timesteps", **address)
        steps = stratified_step_indices(uniforms, self.sampling.steps, args.timestep_fraction)
        shape = self.adapter.latent_shape
        noises = [
            addressed_randn(shape, purpose=f"awm-noise-{k}", **address).to(device, batch.final.dtype)
            for k in range(args.train_timesteps)
        ]
        return self.sigma_table[steps].to(device), noises

    def _log_prob(self, velocity: Tensor, noise: Tensor, x0: Tensor, sigma: Tensor) -> Tensor:
        error = matching_error(velocity, noise, x0).double()
        return -weighted_error(error, sigma.double(), self.args.weighting, self.args.ghuber_power)

    @torch.no_grad()
    def sampling_log_probs(self, samples: Rollout) -> dict[int, Tensor]:
        """``log p~_old`` [K] per global sample index, under the current (sampling) weights.

        Computed on the shuffled micro-batches of ``train_on_rollout``'s first pass (same order,
        same composition), so the first micro-batch's ratios are exactly one.
        """
        device = self.accelerator.device
        values: dict[int, Tensor] = {}
        for micro in self.rollouts.micro_batches(len(samples), self.progress.rollout_iteration, epoch=0):
            if not micro.rows:
                continue
            batch = samples.select(micro.rows)
            x0 = batch.final.to(device)
            state = self.adapter.prepare_condition_state(batch.conditions.to(device))
            sigmas, noises = self.training_points(batch)
            log_probs = []
            for k, noise in enumerate(noises):
                sigma = sigmas[:, k]
                velocity = self.adapter.velocity(noised(x0, noise, sigma), sigma, state)
                log_probs.append(self._log_prob(velocity, noise, x0, sigma))
            if micro.share == 0:
                continue  # a weightless pass of a sharded rank: its row is scored in its own micro-batch
            for index, row in zip(batch.indices.tolist(), torch.stack(log_probs, 1), strict=True):
                values[index] = row
        return values

    def _snapshot_velocity(self, name: str, x: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        with torch.no_grad(), self.adapter.use_snapshot(name):
            return self.adapter.velocity(x, sigma, state)

    def awm_loss(self, batch: Rollout, *, scale: float) -> Objective:
        """One micro-batch's AWM loss, one part per trained timestep; its metrics."""
        assert batch.advantages is not None
        args, device = self.args, self.accelerator.device
        x0 = batch.final.to(device)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        sigmas, noises = self.training_points(batch)
        old = torch.stack([self.old_log_probs[i] for i in batch.indices.tolist()]).to(device)
        advantages = args.advantage_scale * batch.advantages.to(device).double() / args.advantage_clip
        count = len(noises)
        totals: Metrics = {}
        deviations = []
        for k, noise in enumerate(noises):
            sigma = sigmas[:, k]
            x = noised(x0, noise, sigma)
            v_ref = self._snapshot_velocity(Snapshot.REFERENCE, x, sigma, state) if args.kl_beta > 0 else None
            v_anchor = self._snapshot_velocity(Snapshot.ANCHOR, x, sigma, state) if args.ema_kl_beta > 0 else None
            velocity = self.adapter.velocity(x, sigma, state)
            log_prob = self._log_prob(velocity, noise, x0, sigma)
            deviation = (torch.exp(log_prob.detach() - old[:, k]) - 1).abs()
            policy = ppo_clip_loss(log_prob, old[:, k], advantages, args.clip_range).float()
            kl = velocity_mse(velocity, v_ref).mean() if v_ref is not None else policy.new_zeros(())
            ema_kl = velocity_mse(velocity, v_anchor).mean() if v_anchor is not None else policy.new_zeros(())
            loss = policy + args.kl_beta * kl + args.ema_kl_beta * ema_kl
            deviations.append(deviation.max())
            step = {
                "loss": loss,
                "policy_loss": policy,
                "kl": kl,
                "ema_kl": ema_kl,
                "clip_fraction": (deviation > args.clip_range).float().mean(),
                "ratio_deviation": deviation.mean(),
            }
            accumulate(totals, step, divisor=count)
            yield loss * (scale / count)
        if self._first_ratio_error is None:
            self._first_ratio_error = torch.stack(deviations).max()
        return totals
