"""Rollouts: SDE steps inside a window (stored for replay), ODE steps elsewhere (Euler, or DPM-Solver++(2M)
after the window)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.base import ModelAdapter
from flowpost.core.sampling.ode import dpm2_step, euler_step
from flowpost.core.sampling.sde import sde_step


@dataclass
class Rollout:
    """One iteration's samples on this rank, with what replay needs for the trained steps.

    ``latents[:, i]`` is ``x_j`` and ``next_latents[:, i]`` is ``x_{j+1}`` for the ``i``-th stored
    step ``j = steps[i]``, sampled at ``sigmas[i] -> sigmas_next[i]``; ``log_probs[:, i]`` its
    rollout log-density and ``means[:, i]`` its rollout transition mean. Decoupled trainers get
    the final samples only: the four trajectory fields are ``None`` and ``steps`` is empty.
    """

    prompts: list[str]
    metadata: list[dict[str, Any]]
    group_ids: Tensor
    indices: Tensor
    conditions: ConditionBatch
    final: Tensor
    steps: Tensor
    sigmas: Tensor
    sigmas_next: Tensor
    latents: Tensor | None = None
    next_latents: Tensor | None = None
    log_probs: Tensor | None = None
    means: Tensor | None = None
    rewards: Tensor | None = None
    advantages: Tensor | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, rows: list[int]) -> Rollout:
        """The rollout restricted to ``rows`` (a training micro-batch)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        shared = {"steps", "sigmas", "sigmas_next"}
        picked: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in shared or value is None:
                continue
            if isinstance(value, list):
                picked[field.name] = [value[r] for r in rows]
            elif isinstance(value, ConditionBatch):
                picked[field.name] = value.index(index)
            else:
                picked[field.name] = value[index]
        return replace(self, **picked)


@torch.no_grad()
def sample_trajectory(
    adapter: ModelAdapter,
    noise: Tensor,
    state: ConditionState,
    sigmas: Tensor,
    *,
    window: range,
    step_noise: dict[int, Tensor],
    dynamics: str,
    noise_level: float,
    guidance: float = 1.0,
    negative: ConditionState | None = None,
    store: bool = True,
    ode_solver: str = "euler",
) -> dict[str, Tensor]:
    """Integrate from ``noise``; steps in ``window`` use ``dynamics`` (noise ``step_noise[j]``), the others
    Euler, or with ``ode_solver="dpm2"`` DPM-Solver++(2M) after the window (its multistep history runs
    through every step before).

    With ``store`` the window's transitions are returned for replay; the final sample always is.
    """
    x = noise
    stored: dict[str, list[Tensor]] = {"latents": [], "next_latents": [], "log_probs": [], "means": []}
    previous: tuple[Tensor, float] | None = None  # the last step's data prediction and its sigma (dpm2)
    for j in range(len(sigmas) - 1):
        velocity = adapter.forward(x, sigmas[j], state, guidance=guidance, negative=negative)
        x0 = (x.float() - float(sigmas[j]) * velocity.float()) if ode_solver == "dpm2" else None
        if j in window:
            out = sde_step(
                dynamics, velocity, x, sigmas[j], sigmas[j + 1], noise_level=noise_level, noise=step_noise[j]
            )
            if store:
                stored["latents"].append(x)
                stored["next_latents"].append(out.prev_sample)
                stored["log_probs"].append(out.log_prob)
                stored["means"].append(out.mean)
            x = out.prev_sample
        elif x0 is not None and j >= window.stop:
            x = dpm2_step(x0, x, float(sigmas[j]), float(sigmas[j + 1]), previous)
        else:
            x = euler_step(velocity, x, sigmas[j], sigmas[j + 1])
        previous = None if x0 is None else (x0, float(sigmas[j]))
    result = {key: torch.stack(values, dim=1) for key, values in stored.items() if values}
    result["final"] = x
    return result
