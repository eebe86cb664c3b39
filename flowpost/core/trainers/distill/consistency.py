"""Consistency distillation: the student's clean-sample prediction at ``x_{t_n}`` matches the EMA
target's at the point one teacher ODE step further, ``x_{t_{n+1}}``.

On the teacher's ``N``-step grid, ``n ~ U{0..N-1}`` and ``x_{t_n} = (1 - sigma_n) x0 + sigma_n eps``
from data; the teacher (with guidance ``w``) takes one Euler step to ``sigma_{n+1}``, and

    L = < (x_{t_n} - sigma_n v_theta(x_{t_n}) - sg[x_{t_{n+1}} - sigma_{n+1} v_target(x_{t_{n+1}})])^2 >

with the target the ``ema`` snapshot (the EMA callback's) or the live weights without gradient. At
``sigma_{n+1} = 0`` the target is the teacher's step itself: the boundary condition.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.sampling.substeps import per_sample
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import DatasetArguments
from flowpost.core.trainers.dataset import DatasetTrainer
from flowpost.core.trainers.distill.teacher import capture_teacher, condition_states, teacher_ode
from flowpost.core.trainers.inputs import BatchLoader
from flowpost.core.trainers.matching import noised
from flowpost.errors import FlowpostError


class ConsistencyArguments(DatasetArguments):
    """``train:`` of a consistency-distillation stage."""

    paradigm: ClassVar[Paradigm] = Paradigm.DISTILLATION

    teacher_steps: int = Field(20, ge=2, description="N: the teacher's ODE grid (the model's inference sigmas)")
    teacher_guidance: float = Field(1.0, ge=0, description="classifier-free guidance of the teacher's ODE step")
    target_weights: Literal["ema", "live"] = Field(
        "ema", description="ema: the EMA callback's snapshot (callbacks.ema); live: the student, without gradient"
    )


def clean_prediction(sample: Tensor, sigma: Tensor, velocity: Tensor) -> Tensor:
    """``x - sigma v`` in fp32 (per-sample sigma [B])."""
    return sample.float() - per_sample(sigma, sample) * velocity.float()


def consistency_loss(student: Tensor, target: Tensor) -> Tensor:
    """Mean over all elements of ``(student - sg(target))^2``, fp32."""
    return (student.float() - target.detach().float()).pow(2).mean()


class ConsistencyTrainer(DatasetTrainer):
    """One teacher ODE step per sample from a data point noised onto the teacher's grid."""

    Arguments = ConsistencyArguments
    args: ConsistencyArguments
    captured_snapshots = {Snapshot.TEACHER: None}  # the ema target is the EMA callback's

    def setup(self) -> None:
        where = f"stages.{self.stage}.data"
        self.conditions = self.inputs.require("conditions", where=where)
        self.loader_factory = self.inputs.require("demonstrations", where=where)
        if self.args.target_weights == "ema" and "ema" not in self.callbacks.callbacks:
            raise FlowpostError(
                "the consistency target is the EMA snapshot; add callbacks.ema (e.g. {decay: 0.99}) "
                "or set train.target_weights: live",
                where=f"stages.{self.stage}.callbacks.ema",
            )
        capture_teacher(self.adapter, init_from=self.spec.init_from, stage=self.stage)
        self.grid = self.adapter.inference_sigmas(self.args.teacher_steps)

    def build_loader(self) -> BatchLoader:
        return self.rank_loader(self.loader_factory)

    def _target_weights(self) -> contextlib.AbstractContextManager:
        if self.args.target_weights == "ema":
            return self.adapter.use_snapshot(Snapshot.EMA)
        return contextlib.nullcontext()

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        args, device = self.args, self.accelerator.device
        x0 = self.adapter.encode_output_state(batch["image"].to(device))
        n = x0.shape[0]
        address = self.noise_address(n)
        noise = addressed_randn(x0.shape[1:], purpose="noise", **address).to(device, x0.dtype)
        steps = args.teacher_steps
        index = (addressed_rand((), purpose="grid-step", **address) * steps).long().clamp(max=steps - 1)
        sigma, sigma_next = self.grid[index].to(device), self.grid[index + 1].to(device)
        guidance = args.teacher_guidance
        state, negative = condition_states(
            self.adapter, self.conditions, batch["prompt"], guidance=guidance, device=device, dtype=x0.dtype
        )
        x_t = noised(x0, noise, sigma)
        with torch.no_grad():
            x_next = teacher_ode(self.adapter, x_t, sigma, sigma_next, state, guidance=guidance, negative=negative)
            with self._target_weights():
                target = clean_prediction(x_next, sigma_next, self.adapter.velocity(x_next, sigma_next, state))
        student = clean_prediction(x_t, sigma, self.adapter.velocity(x_t, sigma, state))
        loss = consistency_loss(student, target)
        return {"loss": loss, "sigma_mean": sigma.float().mean()}
