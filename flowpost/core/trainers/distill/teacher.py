"""The frozen teacher every distillation trainer reads: the stage's init weights, as a snapshot."""

from __future__ import annotations

import torch
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT, ConditionState
from flowpost.core.models.base import ModelAdapter
from flowpost.core.sampling.substeps import per_sample, solve_ode
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.inputs import ConditionTable
from flowpost.errors import FlowpostError


def capture_teacher(adapter: ModelAdapter, *, init_from: str | None, stage: str) -> None:
    """Freeze the weights the stage starts from as the ``teacher`` snapshot.

    A stage trained from scratch has no teacher: its init weights are random.
    """
    if init_from is None:
        raise FlowpostError(
            "distillation needs a teacher: the weights the stage starts from; set model.init to a trained stage",
            where=f"stages.{stage}.model.init",
        )
    adapter.snapshots.capture(Snapshot.TEACHER, adapter.module())


def condition_states(
    adapter: ModelAdapter,
    conditions: ConditionTable,
    prompts: list[str],
    *,
    guidance: float,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[ConditionState, ConditionState | None]:
    """The prompts' condition state and, when ``guidance != 1``, the null prompt's (classifier-free guidance)."""
    state = adapter.prepare_condition_state(conditions.lookup(prompts).to(device, dtype))
    if guidance == 1.0:
        return state, None
    if NULL_PROMPT not in conditions:
        raise FlowpostError(
            "teacher guidance needs the null prompt in the condition cache; re-run the conditions node",
            where=conditions.where,
        )
    negative = adapter.prepare_condition_state(conditions.lookup([NULL_PROMPT] * len(prompts)).to(device, dtype))
    return state, negative


def teacher_ode(
    adapter: ModelAdapter,
    sample: Tensor,
    sigma: Tensor,
    sigma_next: Tensor,
    state: ConditionState,
    *,
    substeps: int = 1,
    guidance: float = 1.0,
    negative: ConditionState | None = None,
) -> Tensor:
    """The teacher snapshot's ODE from ``sigma`` to ``sigma_next`` (``substeps`` Euler steps), no gradient."""
    with adapter.use_snapshot(Snapshot.TEACHER):
        return solve_ode(
            adapter, sample, sigma, sigma_next, state, substeps=substeps, guidance=guidance, negative=negative
        )


def teacher_velocity(
    adapter: ModelAdapter,
    sample: Tensor,
    sigma: Tensor,
    sigma_next: Tensor,
    state: ConditionState,
    *,
    substeps: int = 1,
    guidance: float = 1.0,
    negative: ConditionState | None = None,
) -> Tensor:
    """The teacher's velocity over the step ``sigma -> sigma_next`` (fp32, no gradient).

    One sub-step: its velocity at ``sample``; more: the average velocity of its ODE over the step,
    ``(x - x_teacher(sigma_next)) / (sigma - sigma_next)``, what one Euler step of the student must
    take to land where the teacher's finer steps do.
    """
    if substeps == 1:
        with torch.no_grad(), adapter.use_snapshot(Snapshot.TEACHER):
            return adapter.forward(sample, sigma, state, guidance=guidance, negative=negative).float()
    landed = teacher_ode(
        adapter, sample, sigma, sigma_next, state, substeps=substeps, guidance=guidance, negative=negative
    )
    return (sample.float() - landed.float()) / (per_sample(sigma, sample) - per_sample(sigma_next, sample))
