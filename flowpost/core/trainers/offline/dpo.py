"""Offline Diffusion-DPO on preference pairs: the policy fits the chosen image better than the rejected one,
relative to a frozen reference (the stage's initial weights)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field

from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.schedules import logit_normal_sigmas
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import DatasetArguments
from flowpost.core.trainers.dataset import DatasetTrainer
from flowpost.core.trainers.inputs import BatchLoader
from flowpost.core.trainers.paired_errors import paired_errors
from flowpost.core.trainers.preference import (
    LossType,
    implicit_accuracy,
    implicit_rewards,
    preference_loss,
    preference_margin,
)
from flowpost.errors import FlowpostError


class OfflineDPOArguments(DatasetArguments):
    """``train:`` of an offline DPO stage; ``batch_size`` counts pairs (two images each)."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED
    reads_latents: ClassVar[bool] = True

    beta: float = Field(1000.0, gt=0, description="DPO scale; the losses use beta / 2 (Diffusion-DPO convention)")
    loss_type: LossType = "sigmoid"
    logit_mean: float = 0.0
    logit_std: float = Field(1.0, gt=0)


class OfflineDPOTrainer(DatasetTrainer):
    """Diffusion-DPO over a finite set of (prompt, chosen, rejected) records, one data epoch per pass.

    Conditions come from the cache; both images are encoded on demand (or read from a latent cache) and
    noised with the same noise and noise level, addressed by (seed, stage, optimizer step, pair index).
    The reference is the ``ref`` snapshot of the weights the stage starts from, so the stage must start from trained
    weights (an earlier stage or ``model.pretrained``). Training runs the conditional model.
    """

    Arguments = OfflineDPOArguments
    args: OfflineDPOArguments
    captured_snapshots = {Snapshot.REFERENCE: None}

    def setup(self) -> None:
        where = f"stages.{self.stage}"
        model = self.spec.config.get("model") or {}
        if self.spec.init_from is None and model.get("pretrained") is None:
            raise FlowpostError(
                "offline DPO measures the policy against a frozen reference, the weights the stage starts from; "
                "set model.init to an earlier stage (or load model.pretrained) instead of training from scratch",
                where=f"{where}.model.init",
            )
        self.conditions = self.inputs.require("conditions", where=f"{where}.data")
        self.loader_factory = self.inputs.require("preferences", where=f"{where}.data.dataset")
        self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())

    def build_loader(self) -> BatchLoader:
        return self.rank_loader(self.loader_factory)

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        device, args = self.accelerator.device, self.args
        chosen = self.clean_latents(batch, "chosen")
        rejected = self.clean_latents(batch, "rejected")
        address = self.noise_address(chosen.shape[0])
        noise = addressed_randn(chosen.shape[1:], purpose="dpo-noise", **address).to(device, chosen.dtype)
        normals = addressed_randn((), purpose="dpo-sigma", **address)
        sigma = logit_normal_sigmas(normals, mean=args.logit_mean, std=args.logit_std, shift=self.adapter.shift)
        errors = paired_errors(
            self.adapter,
            chosen=chosen,
            rejected=rejected,
            noise=noise,
            sigma=sigma.to(device),
            conditions=self.conditions.lookup(list(batch["prompt"])),
            reference=Snapshot.REFERENCE,
        )
        (policy_w, policy_l), (ref_w, ref_l) = errors.policy, errors.reference
        margin = preference_margin(policy_w, policy_l, ref_w, ref_l)
        reward_w, reward_l = implicit_rewards(policy_w.detach(), policy_l.detach(), ref_w, ref_l, beta=args.beta)
        detached = margin.detach()
        return {
            "loss": preference_loss(margin, beta=args.beta, loss_type=args.loss_type).mean(),
            "margin": detached.mean(),
            "implicit_accuracy": implicit_accuracy(detached),
            "reward_chosen": reward_w.mean(),
            "reward_rejected": reward_l.mean(),
            "reward_margin": (reward_w - reward_l).mean(),
        }
