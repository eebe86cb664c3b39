"""The states a few-step student's ODE rollout passed through, as the distillers read them."""

from __future__ import annotations

import torch
from torch import Tensor

from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.errors import FlowpostError


def student_states(rollout: Rollout, *, where: str) -> tuple[Tensor, Tensor]:
    """``(states [B, K, ...], sigmas [K + 1])``: ``states[:, k]`` is the input of step ``k``, integrated
    from ``sigmas[k]`` to ``sigmas[k + 1]``; the rollout must have stored every step (ODE, no window)."""
    if rollout.latents is None or rollout.next_latents is None:
        raise FlowpostError("the distiller reads the student's stored rollout states; none were stored", where=where)
    steps = rollout.steps.tolist()
    if steps != list(range(len(steps))):
        raise FlowpostError(
            f"the stored steps {steps} are not the whole trajectory; remove sampling.window", where=where
        )
    states = torch.cat([rollout.latents, rollout.next_latents[:, -1:]], dim=1)
    final = torch.zeros(1, dtype=rollout.sigmas.dtype)  # every inference grid ends at sigma 0
    return states, torch.cat([rollout.sigmas, rollout.sigmas_next[-1:], final])
