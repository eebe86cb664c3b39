"""Online DPO: one chosen/rejected pair per rollout group, Diffusion-DPO on the forward process."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.schedules import logit_normal_sigmas
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import velocity_mse
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.paired_errors import paired_errors
from flowpost.core.trainers.preference import (
    LossType,
    group_pairs,
    implicit_accuracy,
    preference_loss,
    preference_margin,
)
from flowpost.core.trainers.rl.rollout import Rollout


class OnlineDPOArguments(OnlineArguments):
    """``train:`` of an online DPO stage; ``train_batch_size`` counts pairs (two samples each)."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    beta: float = Field(1000.0, gt=0, description="DPO scale; the losses use beta / 2 (Diffusion-DPO convention)")
    loss_type: LossType = "sigmoid"
    timesteps_per_pair: int = Field(1, ge=1, description="noise levels drawn per pair and micro-batch")
    logit_mean: float = 0.0
    logit_std: float = Field(1.0, gt=0)
    ref_update_every: int = Field(
        0, ge=0, description="optimizer steps between copies of the policy into the reference; 0: frozen"
    )
    kl_beta: float = Field(0.0, ge=0, description="weight of <(v_theta - v_ref)^2> averaged over both arms")


@dataclass
class PreferencePairs(Rollout):
    """The chosen rows of a rollout; the rejected sample of each pair's group is carried alongside.

    ``valid`` is False for a group whose rewards were all equal (no preference, zero weight).
    """

    rejected: Tensor | None = None
    rejected_rewards: Tensor | None = None
    valid: Tensor | None = None


def preference_pairs(samples: Rollout, *, ranked_by: Literal["rewards", "advantages"] = "rewards") -> PreferencePairs:
    """One pair per group of a scored rollout: the argmax (chosen) against the argmin (rejected) of its
    weighted reward sum, or of its advantage (per-reward normalisation ranks by the combined advantage)."""
    scores = samples.rewards if ranked_by == "rewards" else samples.advantages
    if samples.rewards is None or scores is None:
        raise ValueError("preference pairs need a scored rollout")
    chosen, rejected, valid = group_pairs(scores, samples.group_ids)
    picked = samples.select(chosen)
    index = torch.as_tensor(rejected, dtype=torch.long)
    return PreferencePairs(
        **{field.name: getattr(picked, field.name) for field in fields(Rollout)},
        rejected=samples.final[index],
        rejected_rewards=samples.rewards[index],
        valid=valid,
    )


class OnlineDPOTrainer(GenerationTrainer):
    """Pairs the best and worst sample of every group and applies the DPO loss to their matching errors.

    Both arms of a pair share the noise and noise level, addressed by the chosen sample's global
    index; the reference is the ``ref`` snapshot, frozen or refreshed every ``ref_update_every``
    optimizer steps. Training runs the conditional model (guidance 1).
    """

    Arguments = OnlineDPOArguments
    args: OnlineDPOArguments
    captured_snapshots = {Snapshot.REFERENCE: None}
    groups_on_one_rank = True  # pairs are drawn within a group

    def setup(self) -> None:
        self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())
        self._reference_step = 0

    def sample(self) -> Rollout:
        return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        per_reward = self.args.reward_normalisation == "per_reward"
        pairs = preference_pairs(samples, ranked_by="advantages" if per_reward else "rewards")
        skipped = float((~pairs.valid).sum())  # a host mask: no sync

        def objective(batch: PreferencePairs, scale: float) -> Objective:
            metrics = yield from self.pair_loss(batch, scale=scale)
            return metrics | {"skipped_pairs": skipped}

        return self.train_on_rollout(pairs, objective)

    def refresh_reference(self) -> None:
        """Copy the policy into ``ref`` once per multiple of ``ref_update_every`` optimizer steps."""
        every, step = self.args.ref_update_every, self.progress.optimizer_step
        if every and step and step % every == 0 and step != self._reference_step:
            self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())
            self._reference_step = step

    def pair_noise(self, batch: PreferencePairs, draw: int) -> tuple[Tensor, Tensor]:
        """Noise [N, *latent] and sigmas [N] of draw ``draw``, addressed by the chosen sample's index."""
        address = {
            "seed": self.spec.seed,
            "stage": self.stage,
            "step": self.progress.rollout_iteration,
            "indices": batch.indices.tolist(),
        }
        noise = addressed_randn(batch.final.shape[1:], purpose=f"dpo-noise-{draw}", **address)
        normals = addressed_randn((), purpose=f"dpo-sigma-{draw}", **address)
        args = self.args
        sigma = logit_normal_sigmas(normals, mean=args.logit_mean, std=args.logit_std, shift=self.adapter.shift)
        return noise, sigma

    def pair_errors(self, batch: PreferencePairs, draw: int) -> tuple[Tensor, Tensor, Tensor]:
        """Policy errors [2, N] (with gradient), reference errors [2, N] and the KL term [N] of one draw.

        Row 0 holds the chosen arm, row 1 the rejected arm.
        """
        device = self.accelerator.device
        noise, sigma = self.pair_noise(batch, draw)
        errors = paired_errors(
            self.adapter,
            chosen=batch.final.to(device),
            rejected=batch.rejected.to(device),
            noise=noise,
            sigma=sigma,
            conditions=batch.conditions,
            reference=Snapshot.REFERENCE,
        )
        kl = velocity_mse(errors.velocity, errors.reference_velocity).view(2, len(batch)).mean(0)
        return errors.policy, errors.reference, kl

    def pair_loss(self, batch: PreferencePairs, *, scale: float) -> Objective:
        """The DPO loss of a micro-batch of pairs (mean over valid pairs), one part per draw; its metrics."""
        self.refresh_reference()
        args, device = self.args, self.accelerator.device
        weight = batch.valid.to(device).float()
        count = max(float(batch.valid.sum()), 1.0)  # the mask is the host's: counted there
        rows = torch.nonzero(batch.valid).flatten().to(device)
        draws = args.timesteps_per_pair
        totals: Metrics = {}
        for draw in range(draws):
            errors, ref_errors, kl = self.pair_errors(batch, draw)
            margin = preference_margin(errors[0], errors[1], ref_errors[0], ref_errors[1])
            per_pair = preference_loss(margin, beta=args.beta, loss_type=args.loss_type) + args.kl_beta * kl
            loss = (weight * per_pair).sum() / count
            valid = margin.detach()[rows]
            step = {
                "loss": loss,
                "kl": (weight * kl.detach()).sum().double() / count,
                "margin": valid.sum().double() / count,
                "implicit_accuracy": implicit_accuracy(valid) if len(rows) else 0.5,
            }
            accumulate(totals, step, divisor=draws)
            yield loss * scale / draws
        rewards = (batch.rewards - batch.rejected_rewards).to(device).float()
        totals["reward_margin"] = (weight * rewards).sum().double() / count
        return totals
