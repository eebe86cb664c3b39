"""GRPO-Guard: GRPO with the ratio re-centred and rescaled per step, and optional 1/step-size weighting.

With ``x' = mu_old + s * xi`` and ``delta = mu_theta - mu_old``, the per-element mean log-ratio is
``<xi delta>/s - <delta^2>/(2 s^2)``: biased below 0 and spread like ``1/s``. GRPO-Guard uses
``rho = exp(s * (log_ratio + <delta^2>/(2 s^2))) = exp(<xi delta>)`` inside PPO-clip, and divides
step ``j``'s loss by its step size ``sigma_j - sigma_{j+1}`` (``reweight_by_step``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.sampling.sde import StepOutput
from flowpost.core.trainers.rl.grpo import GRPOArguments, GRPOTrainer
from flowpost.core.trainers.rl.rollout import Rollout


class GRPOGuardArguments(GRPOArguments):
    """``train:`` of a GRPO-Guard stage. The normalised ratio is concentrated: use small clip ranges."""

    clip_range: float = Field(1e-5, gt=0, description="clip epsilon of the normalised ratio")
    reweight_by_step: bool = Field(True, description="divide each step's loss by its step size")


def normalized_ratio(log_prob: Tensor, old_log_prob: Tensor, mean: Tensor, old_mean: Tensor, std: Tensor) -> Tensor:
    """``exp(s * (log_prob - old_log_prob + <(mean - old_mean)^2> / (2 s^2)))`` per sample, ``s`` the step std."""
    s = std.float().flatten()
    s = s if s.numel() == log_prob.numel() else s.expand(log_prob.shape[0])
    shift = (mean.float() - old_mean.float()).pow(2).flatten(1).mean(1) / (2.0 * s**2)
    return torch.exp(s * (log_prob - old_log_prob + shift))


class GRPOGuardTrainer(GRPOTrainer):
    """PPO-clip on the normalised ratio; everything else is GRPO."""

    Arguments = GRPOGuardArguments
    args: GRPOGuardArguments

    def policy_loss(
        self, out: StepOutput, batch: Rollout, i: int, advantages: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        device = out.log_prob.device
        ratio = normalized_ratio(
            out.log_prob, batch.log_probs[:, i].to(device), out.mean, batch.means[:, i].to(device), out.std
        )
        clip = self.args.clip_range
        loss = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)).mean()
        if self.args.reweight_by_step:
            loss = loss / float(batch.sigmas[i] - batch.sigmas_next[i])  # the rollout's sigmas: host values
        clipped = ((ratio.detach() - 1).abs() > clip).float().mean()
        return loss, {"clip_fraction": clipped}
