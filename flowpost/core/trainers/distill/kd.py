"""Knowledge distillation onto cached teacher ODE trajectories (FastVideo's ODE-trajectory regression).

A ``teacher-trajectories`` dataset holds, per record, the teacher's states at the student's ``K``
sigmas ``x_{t_0} .. x_{t_{K-1}}`` and its endpoint ``x0_T`` (stacked along the channels). Each
sample draws ``i ~ U{0..K-1}`` and regresses the student's clean prediction at the teacher's state:

    L = 1/2 < (x_{t_i} - sigma_i v_theta(x_{t_i}) - x0_T)^2 >
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_rand
from flowpost.core.sampling.substeps import per_sample
from flowpost.core.trainers.arguments import DatasetArguments
from flowpost.core.trainers.dataset import DatasetTrainer
from flowpost.core.trainers.inputs import BatchLoader
from flowpost.errors import FlowpostError


class KDArguments(DatasetArguments):
    """``train:`` of a KD stage; the student's steps are the trajectories' (``datasets.*.trajectories.steps``)."""

    paradigm: ClassVar[Paradigm] = Paradigm.DISTILLATION
    reads_trajectories: ClassVar[bool] = True


def kd_loss(student_velocity: Tensor, state: Tensor, sigma: Tensor, teacher_x0: Tensor) -> Tensor:
    """``1/2`` the mean over all elements of ``(x - sigma v - x0_T)^2`` (per-sample sigma [B]), fp32."""
    predicted = state.float() - per_sample(sigma, state) * student_velocity.float()
    return 0.5 * (predicted - teacher_x0.float()).pow(2).mean()


def split_trajectory(stacked: Tensor, latent_shape: tuple[int, ...], states: int) -> Tensor:
    """[B, states, *latent_shape] from records stacked along the channels ([B, states * C, ...])."""
    expected = (states * latent_shape[0], *latent_shape[1:])
    if tuple(stacked.shape[1:]) != expected:
        raise ValueError(f"trajectory records have shape {tuple(stacked.shape[1:])}, expected {expected}")
    return stacked.reshape(stacked.shape[0], states, *latent_shape)


class KDTrainer(DatasetTrainer):
    """Regresses the student's clean prediction at cached teacher states onto the teacher's endpoint."""

    Arguments = KDArguments
    args: KDArguments

    def setup(self) -> None:
        where = f"stages.{self.stage}.data"
        self.conditions = self.inputs.require("conditions", where=where)
        self.loader_factory = self.inputs.require("demonstrations", where=where)
        sigmas = self.inputs.trajectory_sigmas
        if sigmas is None:
            raise FlowpostError(
                "kd trains on cached teacher ODE trajectories; point data.dataset at a 'teacher-trajectories' dataset",
                where=f"{where}.dataset",
            )
        self.sigmas = torch.tensor(sigmas, dtype=torch.float32)

    def build_loader(self) -> BatchLoader:
        return self.rank_loader(self.loader_factory)

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        device = self.accelerator.device
        steps = len(self.sigmas) - 1
        try:
            trajectory = split_trajectory(batch["image"].to(device), self.adapter.latent_shape, steps + 1)
        except ValueError as exc:
            raise FlowpostError(
                f"{exc}: the trajectories were sampled from another model; sample them from this stage's "
                "model.init (datasets.*.trajectories.stage)",
                where=f"stages.{self.stage}.data.dataset",
            ) from None
        n = trajectory.shape[0]
        address = self.noise_address(n)
        index = (addressed_rand((), purpose="trajectory-step", **address) * steps).long().clamp(max=steps - 1)
        rows = torch.arange(n)
        state = trajectory[rows.to(device), index.to(device)]
        sigma = self.sigmas[index].to(device)
        encoded = self.conditions.lookup(batch["prompt"]).to(device, state.dtype)
        condition = self.adapter.prepare_condition_state(encoded)
        velocity = self.adapter.velocity(state, sigma, condition)
        return {"loss": kd_loss(velocity, state, sigma, trajectory[:, -1]), "sigma_mean": sigma.mean()}
