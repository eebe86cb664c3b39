"""Euler integration of a model's ODE between two noise levels in equal sub-steps, and the states a
coarse grid visits when each of its steps is integrated that way (what a many-step teacher does
over one step of a few-step student)."""

from __future__ import annotations

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.models.base import ModelAdapter


def per_sample(sigma: Tensor | float, like: Tensor) -> Tensor:
    """``sigma`` (a scalar or per-sample [B]) as fp32 ``[B, 1, ...]`` on ``like``'s device."""
    value = torch.as_tensor(sigma, dtype=torch.float32).to(like.device)
    return value.expand(like.shape[0]).reshape(-1, *([1] * (like.dim() - 1)))


@torch.no_grad()
def solve_ode(
    adapter: ModelAdapter,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    state: ConditionState,
    *,
    substeps: int = 1,
    guidance: float = 1.0,
    negative: ConditionState | None = None,
) -> Tensor:
    """``x(sigma_next)`` from ``x(sigma) = sample``: ``substeps`` Euler steps equally spaced in sigma.

    Sigmas are scalars or per-sample [B]; arithmetic is fp32 on the sample's device and the result
    takes the sample's dtype. One sub-step is one plain Euler step.
    """
    if substeps < 1:
        raise ValueError(f"substeps must be at least 1, got {substeps}")
    start, end = per_sample(sigma, sample), per_sample(sigma_next, sample)
    x = sample.float()
    for k in range(substeps):
        here = start + (end - start) * (k / substeps)
        there = start + (end - start) * ((k + 1) / substeps)
        velocity = adapter.forward(
            x.to(sample.dtype), here.flatten().to(sample.dtype), state, guidance=guidance, negative=negative
        )
        x = x + (there - here) * velocity.float()
    return x.to(sample.dtype)


@torch.no_grad()
def ode_states(
    adapter: ModelAdapter,
    noise: Tensor,
    state: ConditionState,
    sigmas: Tensor,
    *,
    substeps: int = 1,
    guidance: float = 1.0,
    negative: ConditionState | None = None,
) -> Tensor:
    """[B, len(sigmas), ...]: the state at every sigma of ``sigmas`` (from ``noise`` at ``sigmas[0]``),
    each step integrated with ``substeps`` Euler sub-steps."""
    states = [noise]
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:], strict=True):
        states.append(
            solve_ode(
                adapter, states[-1], sigma, sigma_next, state, substeps=substeps, guidance=guidance, negative=negative
            )
        )
    return torch.stack(states, dim=1)
