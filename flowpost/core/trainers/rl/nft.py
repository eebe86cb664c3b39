"""DiffusionNFT: negative-aware fine-tuning on the forward process of the policy's own samples.

Only clean final samples and their rewards are used, so any sampler works. With the old policy
``v_old`` (a snapshot refreshed once per iteration) the implicit positive and negative policies are
``v+ = beta v + (1 - beta) sg(v_old)`` and ``v- = (1 + beta) sg(v_old) - beta v``; each noised sample
fits ``v+`` to its data with weight ``r`` and ``v-`` with weight ``1 - r``, ``r`` the advantage
mapped to [0, 1]. Fitting ``v-`` moves ``v`` away from the data, past ``v_old``.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_generator, addressed_randn
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import noised, velocity_mse
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.rl.rollout import Rollout


class NFTArguments(OnlineArguments):
    """``train:`` of a DiffusionNFT stage."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    beta: float = Field(1.0, gt=0, description="implicit-policy mixing: v+ = beta v + (1 - beta) v_old")
    kl_beta: float = Field(1e-4, ge=0, description="weight of the velocity MSE to the setup weights (0: no reference)")
    old_decay: Literal[0, 1, 2] = Field(
        1,
        description="old-policy refresh after each iteration, k = optimizer steps so far: "
        "0: old = current; 1: decay min(0.001 k, 0.5); 2: 0 before k = 75, then min(0.0075 (k - 75), 0.999)",
    )
    timestep_fraction: float = Field(
        0.99, gt=0, le=1, description="trains the first int(steps * fraction) of a per-sample permutation of the steps"
    )
    adv_mode: Literal["all", "positive_only", "negative_only", "one_only", "binary"] = Field(
        "all",
        description="advantages used: all; clipped at 0 from below / above; 1 where positive else 0; their sign",
    )
    rollout_policy: Literal["old", "live"] = Field("old", description="weights that sample the rollouts")


def old_decay(decay_type: int, step: int) -> float:
    """The decay ``d`` of ``theta_old <- d theta_old + (1 - d) theta`` after ``step`` optimizer steps."""
    if decay_type == 0:
        return 0.0
    if decay_type == 1:
        return min(0.001 * step, 0.5)
    if decay_type == 2:
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    raise ValueError(f"unknown old-policy decay type {decay_type}")


def optimality_weights(advantages: Tensor, clip: float, mode: str = "all") -> Tensor:
    """``r = clip(1/2 + clip(A, -clip, clip) / (2 clip), 0, 1)`` after the ``adv_mode`` mapping."""
    if mode == "positive_only":
        advantages = advantages.clamp(min=0)
    elif mode == "negative_only":
        advantages = advantages.clamp(max=0)
    elif mode == "one_only":
        advantages = (advantages > 0).to(advantages.dtype)
    elif mode == "binary":
        advantages = torch.sign(advantages)
    return (0.5 + advantages.clamp(-clip, clip) / (2 * clip)).clamp(0, 1)


def _adaptive_x0_error(x0_pred: Tensor, x0: Tensor) -> Tensor:
    """Per-sample ``mean((x0_pred - x0)^2) / sg(max(mean|x0_pred - x0|, 1e-5))``, in float64."""
    diff = x0_pred.double() - x0.double()
    weight = diff.detach().abs().flatten(1).mean(1).clamp_min(1e-5)
    return diff.pow(2).flatten(1).mean(1) / weight


def nft_loss(
    velocity: Tensor, old_velocity: Tensor, x_t: Tensor, x0: Tensor, sigma: Tensor, r: Tensor, *, beta: float
) -> Tensor:
    """Per-sample ``(r E+ + (1 - r) E-) / beta`` with ``E±`` the adaptive x0-errors of ``v±``."""
    old = old_velocity.detach().float()
    velocity = velocity.float()
    positive = beta * velocity + (1 - beta) * old
    negative = (1 + beta) * old - beta * velocity
    t = sigma.view(-1, *([1] * (x_t.dim() - 1))).float()
    x_t = x_t.float()
    r = r.double()
    error_pos = _adaptive_x0_error(x_t - t * positive, x0)
    error_neg = _adaptive_x0_error(x_t - t * negative, x0)
    return (r * error_pos + (1 - r) * error_neg) / beta


class NFTTrainer(GenerationTrainer):
    """Samples with the old policy, then fits the implicit policies on noised final samples."""

    Arguments = NFTArguments
    args: NFTArguments
    captured_snapshots = {Snapshot.OLD: None, Snapshot.REFERENCE: "kl_beta"}

    def setup(self) -> None:
        module = self.adapter.module()
        self.adapter.snapshots.capture(Snapshot.OLD, module)
        if self.args.kl_beta > 0:
            self.adapter.snapshots.capture(Snapshot.REFERENCE, module)
        self._passes: Counter[int] = Counter()

    def sample(self) -> Rollout:
        if self.args.rollout_policy == "live":
            return self.generate()
        with self.adapter.use_snapshot(Snapshot.OLD):
            return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        self._passes = Counter()
        return self.train_on_rollout(samples, self.loss)

    def _after_acquisition_cycle(self) -> dict[str, float]:
        decay = old_decay(self.args.old_decay, self.progress.optimizer_step)
        self.adapter.snapshots.ema_update(Snapshot.OLD, self.adapter.module(), decay)
        return {"old_decay": decay}

    def trained_sigmas(self, batch: Rollout) -> Tensor:
        """[B, n] sigmas of the trained steps: a per-sample permutation of the sampling sigmas, cut to n."""
        sigmas = self.adapter.inference_sigmas(self.sampling.steps)[:-1]
        count = max(int(len(sigmas) * self.args.timestep_fraction), 1)
        iteration = self.progress.rollout_iteration
        rows = []
        for index in batch.indices.tolist():
            generator = addressed_generator(
                self.spec.seed, self.stage, iteration, index, f"nft-timesteps-{self._passes[index]}"
            )
            rows.append(sigmas[torch.randperm(len(sigmas), generator=generator)[:count]])
        return torch.stack(rows)

    def loss(self, batch: Rollout, scale: float) -> Objective:
        """The NFT loss of one micro-batch, one part per trained step; its metrics."""
        assert batch.advantages is not None
        args, device = self.args, self.accelerator.device
        x0 = batch.final.to(device)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        r = optimality_weights(batch.advantages.to(device).float(), args.advantage_clip, args.adv_mode)
        sigmas = self.trained_sigmas(batch).to(device)
        steps = sigmas.shape[1]
        address = {"seed": self.spec.seed, "stage": self.stage, "step": self.progress.rollout_iteration}
        indices = batch.indices.tolist()
        passes = [self._passes[i] for i in indices]
        totals: Metrics = {}
        for j in range(steps):
            noise = torch.cat(
                [
                    addressed_randn(x0.shape[1:], indices=[i], purpose=f"nft-noise-{p}-{j}", **address)
                    for i, p in zip(indices, passes, strict=True)
                ]
            ).to(device, x0.dtype)
            sigma = sigmas[:, j]
            x_t = noised(x0, noise, sigma)
            # snapshots are swapped in place, so their forwards precede the graph of the live one
            with torch.no_grad(), self.adapter.use_snapshot(Snapshot.OLD):
                v_old = self.adapter.velocity(x_t, sigma, state)
            v_ref = None
            if args.kl_beta > 0:
                with torch.no_grad(), self.adapter.use_snapshot(Snapshot.REFERENCE):
                    v_ref = self.adapter.velocity(x_t, sigma, state)
            velocity = self.adapter.velocity(x_t, sigma, state)
            policy = args.advantage_clip * nft_loss(velocity, v_old, x_t, x0, sigma, r, beta=args.beta).mean()
            kl = velocity_mse(velocity, v_ref).mean() if v_ref is not None else torch.zeros((), device=device)
            loss = policy + args.kl_beta * kl
            accumulate(totals, {"loss": loss, "nft_loss": policy, "kl": kl}, divisor=steps)
            yield loss * scale / steps
        self._passes.update(indices)
        accumulate(totals, {"r_mean": r.mean()})
        return totals
