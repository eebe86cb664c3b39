"""Deterministic Euler steps and the ODE sampling loop."""

from __future__ import annotations

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.models.base import ModelAdapter


def euler_step(velocity: Tensor, sample: Tensor, sigma: Tensor | float, sigma_next: Tensor | float) -> Tensor:
    """``x' = x + (sigma_next - sigma) * v`` computed in fp32 on the sample's device, returned in its dtype."""
    sigma_t = torch.as_tensor(sigma, dtype=torch.float32, device=sample.device)
    delta = torch.as_tensor(sigma_next, dtype=torch.float32, device=sample.device) - sigma_t
    return (sample.float() + delta * velocity.float()).to(sample.dtype)


@torch.no_grad()
def sample_ode(
    adapter: ModelAdapter,
    noise: Tensor,
    state: ConditionState,
    sigmas: Tensor,
    *,
    guidance: float = 1.0,
    negative: ConditionState | None = None,
) -> Tensor:
    """Integrate from pure noise (sigma = sigmas[0]) to sigmas[-1]; returns latents."""
    sample = noise
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:], strict=True):
        velocity = adapter.forward(sample, sigma, state, guidance=guidance, negative=negative)
        sample = euler_step(velocity, sample, sigma, sigma_next)
    return sample
