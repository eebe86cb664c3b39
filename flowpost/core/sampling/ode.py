"""Deterministic ODE steps (Euler, DPM-Solver++(2M)) and the ODE sampling loop."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.models.base import ModelAdapter


def euler_step(velocity: Tensor, sample: Tensor, sigma: Tensor | float, sigma_next: Tensor | float) -> Tensor:
    """``x' = x + (sigma_next - sigma) * v`` computed in fp32 on the sample's device, returned in its dtype."""
    sigma_t = torch.as_tensor(sigma, dtype=torch.float32, device=sample.device)
    delta = torch.as_tensor(sigma_next, dtype=torch.float32, device=sample.device) - sigma_t
    return (sample.float() + delta * velocity.float()).to(sample.dtype)


def dpm2_step(
    x0: Tensor, sample: Tensor, sigma: float, sigma_next: float, previous: tuple[Tensor, float] | None = None
) -> Tensor:
    """One DPM-Solver++(2M) step ``sigma -> sigma_next`` of the flow ODE, from the data prediction ``x0 = x - sigma v``.

    With ``alpha = 1 - sigma``, ``lambda = log(alpha / sigma)`` and ``h = lambda_next - lambda``, the first-order
    step is ``x' = (sigma_next / sigma) x + alpha_next (1 - e^-h) x0`` (exactly Euler on this schedule). Given
    ``previous = (x0_prev, sigma_prev)``, the data prediction at the grid point before ``sigma``, the step adds
    the midpoint correction ``alpha_next (1 - e^-h) D1 / 2`` with ``D1 = (x0 - x0_prev) h / (lambda - lambda_prev)``.
    It stays first order without ``previous``, from ``sigma_prev = 1`` (no finite ``lambda``) and into
    ``sigma_next = 0`` (``x' = x0``). The sigmas are host numbers; the arithmetic is fp32 on the sample's
    device and the result takes the sample's dtype.
    """
    sigma, sigma_next = float(sigma), float(sigma_next)
    if not 0.0 <= sigma_next < sigma <= 1.0:
        raise ValueError(f"need 0 <= sigma_next < sigma <= 1, got {sigma} -> {sigma_next}")
    data = x0.float()
    if sigma_next == 0.0:
        return data.to(sample.dtype)
    lam_next = math.log((1.0 - sigma_next) / sigma_next)
    lam = math.log((1.0 - sigma) / sigma) if sigma < 1.0 else -math.inf
    weight = (1.0 - sigma_next) * -math.expm1(lam - lam_next)  # alpha_next (1 - e^-h)
    x = (sigma_next / sigma) * sample.float() + weight * data
    if previous is not None and sigma < 1.0 and float(previous[1]) < 1.0:
        prev_x0, prev_sigma = previous[0], float(previous[1])
        ratio = (lam_next - lam) / (lam - math.log((1.0 - prev_sigma) / prev_sigma))  # h / h_prev = 1 / r0
        x = x + (0.5 * weight * ratio) * (data - prev_x0.float())
    return x.to(sample.dtype)


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
