"""DiffusionOPD: on-policy distillation from a frozen teacher along the student's own rollouts.

At every state ``x_j`` the student visited (same state, same step for both), the student's step is
compared with the teacher's in one of three spaces:

- ``xt``: transition means, ``1/2 <(mu_S - mu_T)^2> / s_j^2`` (``s_j^2`` the step's transition
  variance, 1 for the ODE): a per-step Gaussian KL;
- ``v``: ``<(v_S - v_T)^2>``;  ``x0``: ``<(x0_S - x0_T)^2>`` with ``x0 = x_j - sigma_j v``.

``v_T`` is the teacher's velocity at ``x_j`` or, with ``teacher_substeps > 1``, its average velocity
over the step when it integrates the step in that many Euler sub-steps: a 4-step student then learns
to land where a 20-step teacher does, which a student that starts as the teacher needs (at one
sub-step it starts at zero loss). No reward, no reward buffer.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.contracts import ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT, ExecutionContract, Paradigm
from flowpost.core.sampling.sde import sde_step
from flowpost.core.sampling.substeps import per_sample
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.distill.teacher import capture_teacher, condition_states, teacher_velocity
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.objective import Metrics, Objective
from flowpost.core.trainers.rl.rollout import Rollout

OPDTarget = Literal["xt", "v", "x0"]
NORMALIZER_EPS = 1e-8


class OPDArguments(OnlineArguments):
    """``train:`` of a DiffusionOPD stage; ``group_size`` rollouts share a prompt (1 is enough)."""

    execution_contract: ClassVar[ExecutionContract] = ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT
    paradigm: ClassVar[Paradigm] = Paradigm.DISTILLATION

    group_size: int = Field(1, ge=1)
    target: OPDTarget = Field("x0", description="xt: Gaussian KL of transition means; v: velocity; x0: clean sample")
    teacher_substeps: int = Field(
        1, ge=1, description="Euler sub-steps the teacher integrates each student step in (1: its velocity at x_j)"
    )
    teacher_guidance: float = Field(1.0, ge=0, description="classifier-free guidance of the teacher")
    self_normalize: bool = Field(False, description="divide each sample's error by sg(<|error|>) + 1e-8")


def opd_loss(
    student_velocity: Tensor,
    teacher_velocity: Tensor,
    sample: Tensor,
    sigma: Tensor,
    sigma_next: Tensor,
    *,
    target: OPDTarget,
    dynamics: str = "ode",
    noise_level: float = 0.0,
    self_normalize: bool = False,
) -> Tensor:
    """Per-sample [B] distillation loss of one step from ``sample`` (per-sample sigmas [B]), fp32."""
    v_s, v_t = student_velocity.float(), teacher_velocity.detach().float()
    if target == "xt":
        mean_s = sde_step(dynamics, v_s, sample, sigma, sigma_next, noise_level=noise_level, prev_sample=sample)
        mean_t = sde_step(dynamics, v_t, sample, sigma, sigma_next, noise_level=noise_level, prev_sample=sample)
        variance = torch.where(mean_s.std > 0, mean_s.std.pow(2), torch.ones_like(mean_s.std))
        error = (mean_s.mean - mean_t.mean) / variance.sqrt()
        scale = 0.5
    elif target == "v":
        error, scale = v_s - v_t, 1.0
    else:
        s = per_sample(sigma, sample)
        error, scale = (sample.float() - s * v_s) - (sample.float() - s * v_t), 1.0
    per_row = scale * error.pow(2).flatten(1).mean(1)
    if self_normalize:
        per_row = per_row / (error.detach().abs().flatten(1).mean(1) + NORMALIZER_EPS)
    return per_row


def trained_states(batch: Rollout, grid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Step-major rows ``k * B + b`` of the states a rollout visited, with their step's sigmas.

    The stored (window) states, plus the last step's state when the window ends right before it
    (the window never holds the last step; its state is the window's final next state).
    """
    assert batch.latents is not None and batch.next_latents is not None
    size, last = len(batch), len(grid) - 2
    states = [batch.latents[:, k] for k in range(len(batch.steps))]
    steps = batch.steps.tolist()
    if steps and steps[-1] == last - 1:
        states.append(batch.next_latents[:, -1])
        steps.append(last)
    index = torch.tensor(steps, dtype=torch.long)
    sigma = grid[index].repeat_interleave(size)
    sigma_next = grid[index + 1].repeat_interleave(size)
    return torch.cat(states), sigma, sigma_next


class OPDTrainer(GenerationTrainer):
    """Student rollouts (any dynamics), then every visited step regressed onto the teacher's."""

    Arguments = OPDArguments
    args: OPDArguments
    captured_snapshots = {Snapshot.TEACHER: None}
    keeps_rollout_states: ClassVar[bool] = True

    def setup(self) -> None:
        self.conditions = self.inputs.require("conditions", where=f"stages.{self.stage}.data")
        capture_teacher(self.adapter, init_from=self.spec.init_from, stage=self.stage)
        self.grid = self.adapter.inference_sigmas(self.sampling.steps)

    def sample(self) -> Rollout:
        return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        return self.train_on_rollout(samples, self.loss)

    def loss(self, batch: Rollout, scale: float) -> Objective:
        """The mean OPD loss of one micro-batch over its visited steps (one part); its metrics."""
        args, sampling, device = self.args, self.sampling, self.accelerator.device
        x, sigma, sigma_next = trained_states(batch, self.grid)
        x = x.to(device)
        sigma, sigma_next = sigma.to(device), sigma_next.to(device)
        repeats = x.shape[0] // len(batch)
        prompts = batch.prompts * repeats
        guidance = args.teacher_guidance
        state, negative = condition_states(
            self.adapter, self.conditions, prompts, guidance=guidance, device=device, dtype=x.dtype
        )
        v_teacher = teacher_velocity(
            self.adapter,
            x,
            sigma,
            sigma_next,
            state,
            substeps=args.teacher_substeps,
            guidance=guidance,
            negative=negative,
        )
        own = sampling.guidance
        student_negative = (
            negative
            if own == guidance
            else condition_states(self.adapter, self.conditions, prompts, guidance=own, device=device, dtype=x.dtype)[1]
        )
        v_student = self.adapter.forward(x, sigma, state, guidance=own, negative=student_negative)
        per_row = opd_loss(
            v_student,
            v_teacher,
            x,
            sigma,
            sigma_next,
            target=args.target,
            dynamics=sampling.dynamics,
            noise_level=sampling.noise_level,
            self_normalize=args.self_normalize,
        )
        loss = per_row.mean()
        yield loss * scale
        return {"loss": loss.detach(), "velocity_gap": (v_student.detach() - v_teacher).abs().mean()}
