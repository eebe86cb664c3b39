"""DPPO: GRPO without ratio clipping; a Gaussian-KL trust region silences samples instead.

A sample's policy-gradient term ``-A * rho`` is masked (stop-gradient 0) only when its transition
left the trust region, ``KL(mu_theta || mu_old) >= trust_region`` (element mean over ``2 s^2``), and
the update would push it further out (``rho > 1`` with ``A > 0``, or ``rho < 1`` with ``A < 0``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.sampling.sde import StepOutput, gaussian_kl_mean
from flowpost.core.trainers.rl.grpo import CoupledArguments, GRPOTrainer
from flowpost.core.trainers.rl.rollout import Rollout


class DPPOArguments(CoupledArguments):
    """``train:`` of a DPPO stage."""

    trust_region: float = Field(1e-5, gt=0, description="KL threshold of the mask (public configs: 1e-6 to 1e-5)")


def trust_region_mask(ratio: Tensor, advantages: Tensor, kl: Tensor, threshold: float) -> Tensor:
    """1 where a sample may still move, 0 where it is outside the region and moving outward."""
    outward = ((ratio > 1) & (advantages > 0)) | ((ratio < 1) & (advantages < 0))
    return (~((kl >= threshold) & outward)).to(ratio.dtype)


class DPPOTrainer(GRPOTrainer):
    """``mean(-A * rho * sg(mask))`` (+ the optional KL to the reference)."""

    Arguments = DPPOArguments
    args: DPPOArguments

    def policy_loss(
        self, out: StepOutput, batch: Rollout, i: int, advantages: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        device = out.log_prob.device
        ratio = torch.exp(out.log_prob - batch.log_probs[:, i].to(device))
        kl = gaussian_kl_mean(out.mean.detach(), batch.means[:, i].to(device), out.std)
        mask = trust_region_mask(ratio.detach(), advantages, kl, self.args.trust_region)
        return (-advantages * ratio * mask).mean(), {"masked_fraction": 1.0 - mask.mean()}
