"""CRD: centered reward distillation on the forward process of the policy's own samples.

A clean sample ``x0``, noised to ``x = (1 - s) x0 + s n``, has the implicit reward ``q = -(e / sg(w) - e_old /
sg(w_old))``: ``e`` the per-element squared error of the live velocity against ``n - x0``, ``e_old`` the old copy's,
``w`` their mean absolute errors (1 without adaptive weighting), averaged over the sample. Within each prompt group
``q`` and the reward weight ``r`` (the advantage mapped to [0, 1]) are centred on weighted group means (the
normaliser of the KL-regularised optimum cancels there), and ``beta q_c`` is regressed onto ``r_c``. A velocity
MSE to the (optionally CFG-guided) reference, weighted per sample by ``r``, bounds the drift; rollouts come from
a sampler copy that trails the live weights more slowly than the old copy does.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator, model_validator
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments, whole_groups
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import noised, velocity_mse
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.rl.dgpo import stratified_indices, trained_step_span
from flowpost.core.trainers.rl.nft import optimality_weights
from flowpost.core.trainers.rl.rollout import Rollout

DecaySchedule = tuple[int, float, float, float]  # (start step, start value, slope per step, end value)


class CRDArguments(OnlineArguments):
    """``train:`` of a CRD stage; ``train_batch_size`` holds whole groups."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    advantage_std: Literal["group", "global"] = Field(
        "global", description="divide the group-centred rewards by the std of the whole iteration (global) or group"
    )
    beta: float = Field(1.0, gt=0, description="scale of the implicit reward regressed onto the centred reward")
    loss_type: Literal["mse", "bce"] = Field(
        "mse", description="mse: (beta q_c - r_c)^2; bce: cross-entropy of sigmoid(beta q_c) to sigmoid(r_c)"
    )
    adaptive_weighting: bool = Field(True, description="divide each squared error by its sample's mean absolute error")
    weight_temperature: float = Field(
        -1.0,
        description="group means for centring: < 0 uniform; 0 the positive- and the negative-advantage rows, "
        "averaged; > 0 softmax(r / T) and softmax(-r / T), averaged",
    )
    old_decay: DecaySchedule = Field(
        (0, 0.25, 0.005, 0.999),
        description="old <- d old + (1 - d) live after each iteration, d = [k0, d0, slope, d1]: d0 before "
        "optimizer step k0, then min(d0 + slope (k - k0), d1)",
    )
    sampler_decay: DecaySchedule = Field(
        (75, 0.0, 0.0075, 0.999), description="the sampler copy's decay after each iteration, as old_decay"
    )
    kl_beta: float = Field(0.1, ge=0, description="weight of <(v - v_ref)^2> to the stage's initial weights")
    kl_guidance: float = Field(4.5, ge=0, description="classifier-free guidance of the reference in the KL term")
    reward_adaptive_kl: bool = Field(True, description="KL weight kl_floor + r (kl_beta - kl_floor) per sample")
    kl_floor: float = Field(1e-4, ge=0, description="KL weight of a sample with r = 0 (reward_adaptive_kl)")
    train_timesteps: int | None = Field(
        None, ge=1, description="sampling-table sigmas trained per group, stratified; null: int(steps * range)"
    )
    timestep_range: float = Field(
        0.99, gt=0, le=1, description="trained sigmas are the sampling sigmas >= 1 - timestep_range"
    )

    @field_validator("train_batch_size")
    @classmethod
    def _whole_groups(cls, size: int, info: ValidationInfo) -> int:
        return whole_groups(size, info.data.get("group_size"), "CRD centres the rewards of a group")

    @field_validator("old_decay", "sampler_decay")
    @classmethod
    def _decay_in_range(cls, schedule: DecaySchedule) -> DecaySchedule:
        start_step, start, slope, end = schedule
        if start_step < 0 or slope < 0 or not (0 <= start <= 1 and 0 <= end <= 1):
            raise ValueError(
                f"a decay schedule [k0, d0, slope, d1] needs k0, slope >= 0 and d0, d1 in [0, 1]: {schedule}"
            )
        return schedule

    @model_validator(mode="after")
    def _kl_floor_below_beta(self) -> CRDArguments:
        if self.reward_adaptive_kl and self.kl_beta > 0 and self.kl_floor > self.kl_beta:
            raise ValueError(
                f"kl_floor ({self.kl_floor:g}) exceeds kl_beta ({self.kl_beta:g}): the reward-adaptive KL weight "
                "runs from kl_floor (r = 0) to kl_beta (r = 1)"
            )
        return self


def snapshot_decay(step: int, schedule: DecaySchedule) -> float:
    """The decay after ``step`` optimizer steps: ``d0`` before ``k0``, then ``min(d0 + slope (step - k0), d1)``."""
    start_step, start, slope, end = schedule
    if step < start_step:
        return start
    return min(start + (step - start_step) * slope, end)


def implicit_reward(velocity: Tensor, old_velocity: Tensor, target: Tensor, *, adaptive: bool) -> Tensor:
    """Per-sample ``-mean(e / sg(w) - e_old / sg(w_old))`` [B] in fp32, ``e = (v - target)^2`` per element and
    ``w`` the sample's mean ``|v - target|`` (at least 1e-5) with ``adaptive``, else 1."""
    diff = velocity.float() - target.float()
    diff_old = old_velocity.detach().float() - target.float()
    error, error_old = diff.pow(2).flatten(1), diff_old.pow(2).flatten(1)
    if adaptive:
        error = error / diff.detach().abs().flatten(1).mean(1, keepdim=True).clamp_min(1e-5)
        error_old = error_old / diff_old.abs().flatten(1).mean(1, keepdim=True).clamp_min(1e-5)
    return -(error - error_old).mean(1)


def group_softmax(logits: Tensor, groups: Tensor, num_groups: int) -> Tensor:
    """Softmax of ``logits`` [B] within each group; a group whose logits are all ``-inf`` gets uniform weights."""
    maxes = logits.new_full((num_groups,), float("-inf")).scatter_reduce(0, groups, logits, "amax")
    empty = maxes == float("-inf")
    logits = torch.where(empty[groups], torch.zeros_like(logits), logits)
    exp = torch.exp(logits - torch.where(empty, torch.zeros_like(maxes), maxes)[groups])
    return exp / exp.new_zeros(num_groups).scatter_add(0, groups, exp)[groups]


def centring_weights(r: Tensor, groups: Tensor, num_groups: int, temperature: float) -> list[Tensor]:
    """The group-mean weights [B] of each centring direction (one for a negative ``temperature``, two otherwise)."""
    if temperature < 0:
        return [group_softmax(torch.zeros_like(r), groups, num_groups)]
    if temperature == 0:
        never = torch.full_like(r, float("-inf"))
        zero = torch.zeros_like(r)
        return [group_softmax(torch.where(r > 0.5, zero, never), groups, num_groups)] + [
            group_softmax(torch.where(r < 0.5, zero, never), groups, num_groups)
        ]
    return [group_softmax(r / temperature, groups, num_groups), group_softmax(-r / temperature, groups, num_groups)]


def centred_reward_loss(
    implicit: Tensor,
    r: Tensor,
    groups: Tensor,
    num_groups: int,
    *,
    beta: float,
    loss_type: str = "mse",
    temperature: float = -1.0,
) -> Tensor:
    """Mean over rows and centring directions of ``(beta q_c - r_c)^2`` (or the cross-entropy of
    ``sigmoid(beta q_c)`` to ``sigmoid(r_c)``), ``x_c = x - sum_{j in g} p_j x_j`` with ``p`` each direction's
    group weights; the implicit rewards' group mean is detached."""
    losses = []
    for p in centring_weights(r, groups, num_groups, temperature):
        r_mean = r.new_zeros(num_groups).scatter_add(0, groups, p * r)[groups]
        q_mean = implicit.new_zeros(num_groups).scatter_add(0, groups, p * implicit.detach())[groups]
        logits, targets = beta * (implicit - q_mean), r - r_mean
        if loss_type == "bce":
            losses.append(F.binary_cross_entropy_with_logits(logits, torch.sigmoid(targets)))
        else:
            losses.append((logits - targets).pow(2).mean())
    return torch.stack(losses).mean()


def kl_weights(r: Tensor, *, kl_beta: float, floor: float, adaptive: bool) -> Tensor:
    """Per-sample KL weights: ``floor + r (kl_beta - floor)`` when ``adaptive``, else ``kl_beta``."""
    return floor + r * (kl_beta - floor) if adaptive else torch.full_like(r, kl_beta)


class CRDTrainer(GenerationTrainer):
    """Centred reward distillation against the old copy on the sampler copy's rollouts.

    Micro-batches hold whole groups (shuffled as groups); a group shares its stratified sigmas, each row
    draws its own noise, both addressed by the rollout iteration, the pass and the group or sample index.
    """

    Arguments = CRDArguments
    args: CRDArguments
    captured_snapshots = {Snapshot.OLD: None, Snapshot.SAMPLER: None, Snapshot.REFERENCE: "kl_beta"}
    whole_groups = True

    def setup(self) -> None:
        args, where = self.args, f"stages.{self.stage}"
        self.sigma_table = self.adapter.inference_sigmas(self.sampling.steps)
        self.span = trained_step_span(self.sigma_table, args.timestep_range)
        self.train_timesteps = args.train_timesteps or max(1, int(self.sampling.steps * args.timestep_range))
        module = self.adapter.module()
        self.adapter.snapshots.capture(Snapshot.OLD, module)
        self.adapter.snapshots.capture(Snapshot.SAMPLER, module)
        self.null = None
        if args.kl_beta > 0:
            self.adapter.snapshots.capture(Snapshot.REFERENCE, module)
            if args.kl_guidance != 1.0:
                conditions = self.inputs.require("conditions", where=f"{where}.data")
                self.null = conditions.lookup([NULL_PROMPT])
        self._passes: Counter[int] = Counter()

    def sample(self) -> Rollout:
        with self.adapter.use_snapshot(Snapshot.SAMPLER):
            return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        self._passes = Counter()
        return self.train_on_rollout(samples, self.loss)

    def _after_acquisition_cycle(self) -> dict[str, float]:
        step, module, snapshots = self.progress.optimizer_step, self.adapter.module(), self.adapter.snapshots
        old, sampler = snapshot_decay(step, self.args.old_decay), snapshot_decay(step, self.args.sampler_decay)
        snapshots.ema_update(Snapshot.OLD, module, old)
        snapshots.ema_update(Snapshot.SAMPLER, module, sampler)
        return {"old_decay": old, "sampler_decay": sampler}

    def training_points(self, batch: Rollout) -> tuple[Tensor, Tensor]:
        """Sigmas [B, K] (equal within a group) and noise [K, B, ...] of a micro-batch's pass; on the device, in
        the dtype of the latents."""
        address = {"seed": self.spec.seed, "stage": self.stage, "step": self.progress.rollout_iteration}
        count = self.train_timesteps
        uniforms, noise = [], []
        for group, index in zip(batch.group_ids.tolist(), batch.indices.tolist(), strict=True):
            draw = self._passes[group]
            uniforms.append(addressed_rand((count,), purpose=f"crd-timesteps-{draw}", indices=[group], **address))
            noise.append(
                addressed_randn(
                    (count, *self.adapter.latent_shape), purpose=f"crd-noise-{draw}", indices=[index], **address
                )
            )
        steps = stratified_indices(torch.cat(uniforms), *self.span)
        device, dtype = self.accelerator.device, batch.final.dtype
        return self.sigma_table[steps].to(device, dtype), torch.cat(noise).transpose(0, 1).to(device, dtype)

    def loss(self, batch: Rollout, scale: float) -> Objective:
        """One micro-batch's CRD loss, one part per trained sigma; its metrics."""
        assert batch.advantages is not None
        args, device = self.args, self.accelerator.device
        x0 = batch.final.to(device)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        negative = None
        if self.null is not None:
            negative = self.adapter.prepare_condition_state(self.null.index([0] * len(batch)).to(device))
        r = optimality_weights(batch.advantages.to(device, torch.float32), args.advantage_clip)
        distinct, groups = torch.unique(batch.group_ids, return_inverse=True)  # host data: no sync
        groups = groups.to(device)
        sigmas, noise = self.training_points(batch)
        count = sigmas.shape[1]
        totals: Metrics = {}
        for k in range(count):
            sigma, eps = sigmas[:, k], noise[k]
            x = noised(x0, eps, sigma)
            # snapshots are swapped in place, so their forwards precede the graph of the live one
            with torch.no_grad(), self.adapter.use_snapshot(Snapshot.OLD):
                v_old = self.adapter.velocity(x, sigma, state)
            v_ref = None
            if args.kl_beta > 0:
                with torch.no_grad(), self.adapter.use_snapshot(Snapshot.REFERENCE):
                    v_ref = self.adapter.forward(x, sigma, state, guidance=args.kl_guidance, negative=negative)
            velocity = self.adapter.velocity(x, sigma, state)
            implicit = implicit_reward(velocity, v_old, eps - x0, adaptive=args.adaptive_weighting)
            unscaled = centred_reward_loss(
                implicit,
                r,
                groups,
                len(distinct),
                beta=args.beta,
                loss_type=args.loss_type,
                temperature=args.weight_temperature,
            )
            policy = unscaled * args.advantage_clip / args.beta
            if v_ref is not None:
                kl = velocity_mse(velocity, v_ref)
                weights = kl_weights(r, kl_beta=args.kl_beta, floor=args.kl_floor, adaptive=args.reward_adaptive_kl)
                kl_term, kl = (weights * kl).mean(), kl.mean()
            else:
                kl_term = kl = torch.zeros((), device=device)
            loss = policy + kl_term
            step = {
                "loss": loss,
                "policy_loss": policy,
                "kl": kl,
                "kl_loss": kl_term,
                "implicit_reward": implicit.detach().mean(),
            }
            accumulate(totals, step, divisor=count)
            yield loss * (scale / count)
        self._passes.update(set(batch.group_ids.tolist()))
        accumulate(totals, {"r_mean": r.mean()})
        return totals
