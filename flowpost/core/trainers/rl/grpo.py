"""Flow-GRPO: PPO-clip on the SDE steps of a rollout, optional KL to a frozen reference."""

from __future__ import annotations

import logging
import math
from typing import Annotated, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from flowpost.core.advantages import zero_advantage_fraction
from flowpost.core.conditions import NULL_PROMPT, ConditionState
from flowpost.core.contracts import Paradigm
from flowpost.core.distributed import max_over_ranks
from flowpost.core.memory import GIB
from flowpost.core.models.footprint import model_footprint
from flowpost.core.models.lora import has_lora
from flowpost.core.sampling.sde import StepOutput, gaussian_kl_mean, noise_scale, sde_step
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.rl.replay_width import auto_replay_width, replay_budget
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.errors import FlowpostError

log = logging.getLogger(__name__)


class CoupledArguments(OnlineArguments):
    """What every trainer on replayed SDE transitions shares (GRPO and its strict extensions)."""

    paradigm: ClassVar[Paradigm] = Paradigm.COUPLED

    kl_beta: float = Field(0.0, ge=0, description="weight of the KL to the reference (0: no reference)")
    kl_space: Literal["x", "v"] = Field("x", description="x: Gaussian KL of transition means; v: velocity MSE")
    kl_scale: Literal["exact", "flow-grpo"] = Field(
        "exact",
        description="x-space KL divisor. exact (default): 2 (g sqrt(dt))^2, the true KL of the two transitions, "
        "so kl_beta weighs the same divergence at any step count and shift; flow-grpo: 2 g^2 as Flow-GRPO, "
        "the KL times the step size dt (the same for cps), so Flow-GRPO's published kl_beta values transfer",
    )
    zero_advantage: Literal["keep", "drop"] = Field(
        "keep",
        description="samples whose advantage is exactly 0 (e.g. constant groups). keep (default): they stay in every "
        "mean, adding KL but no policy gradient; drop: they leave the loss and the other rows are renormalised "
        "over the gathered rollout, as Flow-GRPO filters them",
    )
    OMITTED_AT_DEFAULT = (*OnlineArguments.OMITTED_AT_DEFAULT, "replay_memory_gib")

    replay_steps_per_pass: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        0,
        description="stored steps replayed per forward/backward pass (0: all; lower it to save memory); auto: "
        "the most whose activations fit replay_memory_gib, chosen once at the first replay and logged",
    )
    replay_memory_gib: float | None = Field(
        None,
        gt=0,
        description="the activation budget of one replay pass under replay_steps_per_pass: auto; null: on CUDA "
        "the free device memory after the weights, gradients and optimizer state, on CPU the network's weight bytes",
    )

    @model_validator(mode="after")
    def _budget_needs_auto(self) -> CoupledArguments:
        if self.replay_memory_gib is not None and self.replay_steps_per_pass != "auto":
            raise ValueError(
                "replay_memory_gib sizes replay_steps_per_pass: auto, which is not set; "
                "set replay_steps_per_pass: auto or remove replay_memory_gib"
            )
        return self


class GRPOArguments(CoupledArguments):
    """``train:`` of a GRPO stage."""

    clip_range: float = Field(1e-4, gt=0, description="PPO ratio clip epsilon")


def step_rows(out: StepOutput, rows: slice) -> StepOutput:
    """The transitions of ``rows`` (``std`` may be per-row or shared)."""
    std = out.std[rows] if out.std.dim() > 0 and out.std.shape[0] == out.log_prob.shape[0] else out.std
    return StepOutput(out.prev_sample[rows], out.log_prob[rows], out.mean[rows], std)


def ppo_clip_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, clip_range: float) -> Tensor:
    """``mean(max(-A * r, -A * clip(r, 1 - eps, 1 + eps)))`` with ``r = exp(log_prob - old_log_prob)``."""
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(unclipped, clipped).mean()


class GRPOTrainer(GenerationTrainer):
    """Replays every stored SDE step of a rollout under the current policy and applies PPO-clip."""

    Arguments: ClassVar[type[CoupledArguments]] = GRPOArguments
    args: CoupledArguments
    captured_snapshots = {Snapshot.REFERENCE: "kl_beta"}
    auto_width: int | None = None  # replay_steps_per_pass: auto, once chosen

    def setup(self) -> None:
        if self.args.kl_beta > 0:
            self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())

    def sample(self) -> Rollout:
        return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        kept = 1.0
        if self.args.zero_advantage == "drop":
            assert samples.advantages is not None
            gathered = self.accelerator.gather(samples.advantages.to(self.accelerator.device))
            kept = 1.0 - zero_advantage_fraction(gathered)  # once per rollout: whether anything trains
        metrics = self.train_on_rollout(samples, lambda batch, scale: self.replay_loss(batch, scale=scale, kept=kept))
        if self.auto_width is not None:
            metrics["replay/steps_per_pass"] = float(self.auto_width)
        return metrics

    def _condition_states(self, batch: Rollout) -> tuple[ConditionState, ConditionState | None]:
        device = self.accelerator.device
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        if self.sampling.guidance == 1.0:
            return state, None
        null = self.inputs.require("conditions", where=f"stages.{self.stage}.data").lookup([NULL_PROMPT] * len(batch))
        return state, self.adapter.prepare_condition_state(null.to(device))

    def _replay_steps(
        self, batch: Rollout, steps: range, state: ConditionState, negative: ConditionState | None
    ) -> tuple[Tensor, StepOutput]:
        """Velocities and transitions of stored ``steps`` in one forward, scoring the stored ``x_{j+1}``.

        Rows are step-major: row ``k * B + b`` is sample ``b`` at step ``steps[k]``.
        """
        assert batch.latents is not None and batch.next_latents is not None
        sampling, device, size = self.sampling, self.accelerator.device, len(batch)
        x = batch.latents[:, steps.start : steps.stop].transpose(0, 1).flatten(0, 1).to(device)
        target = batch.next_latents[:, steps.start : steps.stop].transpose(0, 1).flatten(0, 1).to(device)
        sigma = batch.sigmas[steps.start : steps.stop].repeat_interleave(size).to(device)
        sigma_next = batch.sigmas_next[steps.start : steps.stop].repeat_interleave(size).to(device)
        repeated = state.cat([state] * len(steps))
        negatives = None if negative is None else negative.cat([negative] * len(steps))
        velocity = self.adapter.forward(x, sigma, repeated, guidance=sampling.guidance, negative=negatives)
        out = sde_step(
            sampling.dynamics, velocity, x, sigma, sigma_next, noise_level=sampling.noise_level, prev_sample=target
        )
        return velocity, out

    def _step_chunks(self, batch: Rollout) -> list[range]:
        """The stored steps grouped into the passes of ``replay_steps_per_pass``."""
        count = len(batch.steps)
        setting = self.args.replay_steps_per_pass
        width = self._auto_replay_width(batch) if setting == "auto" else setting or count
        return [range(start, min(start + width, count)) for start in range(0, count, width)]

    def _auto_replay_width(self, batch: Rollout) -> int:
        """``replay_steps_per_pass: auto``: chosen at the first replay for the configured micro-batch (the least
        over the ranks, so their passes stay in step), then kept."""
        if self.auto_width is None:
            assert batch.latents is not None
            where = f"stages.{self.stage}.train.replay_steps_per_pass"
            try:
                footprint = model_footprint(self.adapter)
            except (AttributeError, TypeError) as error:
                raise FlowpostError(
                    f"auto cannot size the replay of this model ({error}); set a number of steps per pass", where=where
                ) from error
            guided = self.sampling.guidance != 1.0
            rows = math.ceil(self.args.train_batch_size / self.accelerator.num_processes) * (2 if guided else 1)
            budget = replay_budget(self.accelerator.device, footprint, self.args.replay_memory_gib)
            width = auto_replay_width(
                footprint,
                steps=len(batch.steps),
                rows=rows,
                text_tokens=int(batch.conditions.token_states.shape[1]),
                dtype=self.adapter.compute_dtype or batch.latents.dtype,
                lora=has_lora(self.adapter.module()),
                budget=budget,
            )
            self.auto_width = -max_over_ranks(-width, self.accelerator.device)  # the ranks' least: passes in step
            log.info(
                "stage %s: replaying %d of %d stored steps per pass (replay_steps_per_pass: auto, %.2f GiB budget)",
                self.stage,
                self.auto_width,
                len(batch.steps),
                budget / GIB,
            )
        return self.auto_width

    @torch.no_grad()
    def replay_log_probs(self, batch: Rollout) -> Tensor:
        """[B, steps] log-probabilities of the stored transitions under the current weights."""
        state, negative = self._condition_states(batch)
        chunks = [self._replay_steps(batch, steps, state, negative)[1].log_prob for steps in self._step_chunks(batch)]
        return torch.cat(chunks).view(len(batch.steps), len(batch)).T

    def replay_loss(self, batch: Rollout, *, scale: float, kept: float = 1.0) -> Objective:
        """The GRPO loss of one micro-batch over its stored steps, one part per replay pass; its metrics.

        With ``zero_advantage: drop``, ``kept`` is the fraction of the gathered rollout with a nonzero
        advantage: zero-advantage rows leave every term and the others weigh ``1 / kept``, so the
        micro-batch losses average to the mean over kept rows whatever the world size (nothing trains
        when ``kept`` is 0).
        """
        assert batch.advantages is not None
        args, device, size = self.args, self.accelerator.device, len(batch)
        state, negative = self._condition_states(batch)
        advantages = batch.advantages.to(device).float()
        weight = 1.0 / kept if kept > 0 else 0.0
        rows_kept = advantages != 0 if args.zero_advantage == "drop" else torch.ones_like(advantages, dtype=torch.bool)
        count = len(batch.steps)
        totals: Metrics = {}
        for steps in self._step_chunks(batch):
            if args.kl_beta > 0:
                with torch.no_grad(), self.adapter.use_snapshot(Snapshot.REFERENCE):
                    v_ref, ref = self._replay_steps(batch, steps, state, negative)
            velocity, out = self._replay_steps(batch, steps, state, negative)
            chunk_loss = torch.zeros((), device=device)
            for k, i in enumerate(steps):
                rows = slice(k * size, (k + 1) * size)
                current = step_rows(out, rows)
                policy, extra = self.policy_loss(current, batch, i, advantages)
                policy = policy * weight  # a zero-advantage row adds exactly 0 to every policy loss
                kl = torch.zeros((), device=device)
                if args.kl_beta > 0:
                    if args.kl_space == "x":
                        kl_rows = gaussian_kl_mean(current.mean, ref.mean[rows], self._kl_std(current, batch, i))
                    else:
                        kl_rows = (velocity[rows].float() - v_ref[rows].float()).pow(2).flatten(1).mean(1)
                    kl = (kl_rows * rows_kept).mean() * weight
                loss = policy + args.kl_beta * kl
                chunk_loss = chunk_loss + loss
                accumulate(totals, {"loss": loss, "policy_loss": policy, "kl": kl, **extra}, divisor=count)
            yield chunk_loss * scale / count
        return totals

    def _kl_std(self, out: StepOutput, batch: Rollout, i: int) -> Tensor:
        """The std the x-space KL of stored step ``i`` divides by (``kl_scale``)."""
        if self.args.kl_scale == "exact":
            return out.std
        sampling = self.sampling
        return noise_scale(sampling.dynamics, batch.sigmas[i], batch.sigmas_next[i], sampling.noise_level)

    def policy_loss(
        self, out: StepOutput, batch: Rollout, i: int, advantages: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """PPO-clip on stored step ``i``; returns the loss and per-step metrics (device tensors)."""
        old = batch.log_probs[:, i].to(out.log_prob.device)
        clip = self.args.clip_range  # type: ignore[attr-defined]
        ratio = torch.exp(out.log_prob.detach() - old)
        clipped = ((ratio - 1).abs() > clip).float().mean()
        return ppo_clip_loss(out.log_prob, old, advantages, clip), {"clip_fraction": clipped}
