"""Flow-matching sigma schedules."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def shift_sigmas(sigmas: Tensor, shift: float) -> Tensor:
    """SD3's constant shift: sigma -> s * sigma / (1 + (s - 1) * sigma); identity for s = 1."""
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def inference_sigmas(num_steps: int, *, shift: float = 1.0) -> Tensor:
    """``num_steps + 1`` decreasing sigmas from 1 to exactly 0: ``shift(linspace(1, 0, N + 1))``, fp32.

    The tiny family's grid (DanceGRPO's; the default pipeline's numbers are tuned on it): equal steps
    before the shift. It is diffusers' ``FlowMatchEulerDiscreteScheduler(shift=s).set_timesteps(
    sigmas=linspace(1, 0, N + 1)[:-1])`` (the scheduler shifts and appends 0), not its default
    ``set_timesteps(N)`` that the SD3 pipeline and Flow-GRPO use, ``shift(linspace(1, sigma_min, N))``
    then 0 with ``sigma_min = shift(1/1000)``, whose last step runs from about ``sigma_min`` to 0.
    """
    if num_steps < 1:
        raise ValueError("num_steps must be at least 1")
    return shift_sigmas(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64), shift).float()


def logit_normal_sigmas(normals: Tensor, *, mean: float = 0.0, std: float = 1.0, shift: float = 1.0) -> Tensor:
    """Training sigmas: ``shift(sigmoid(mean + std * n))`` for standard-normal draws ``n``."""
    return shift_sigmas(torch.sigmoid(mean + std * normals), shift)


def flux_shift_mu(
    image_seq_len: int,
    *,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """FLUX's resolution-dependent shift: linear in the packed token count, ``base_shift`` at
    ``base_seq_len`` and ``max_shift`` at ``max_seq_len``; no clamping (longer sequences extrapolate)."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return base_shift + slope * (image_seq_len - base_seq_len)


def flux2_shift_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's empirical shift (its diffusers pipelines' ``compute_empirical_mu``): two lines in the packed
    token count fitted at 10 and 200 steps, interpolated linearly in the step count; past 4300 tokens the
    200-step line alone."""
    at_200 = 1.6927e-4 * image_seq_len + 0.45666666
    if image_seq_len > 4300:
        return float(at_200)
    at_10 = 8.73809524e-5 * image_seq_len + 1.89833333
    slope = (at_200 - at_10) / 190.0
    return float(slope * num_steps + (at_200 - 200.0 * slope))


def flux_sigmas(
    num_steps: int,
    image_seq_len: int,
    *,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> Tensor:
    """FLUX inference sigmas (as diffusers' FLUX pipeline), ``num_steps + 1`` entries, fp32.

    ``linspace(1, 1 / N, N)`` through the exponential time shift
    ``sigma -> e^mu / (e^mu + (1 / sigma - 1))`` with ``mu = flux_shift_mu(image_seq_len)``, then a
    terminal 0.
    """
    if num_steps < 1:
        raise ValueError("num_steps must be at least 1")
    mu = flux_shift_mu(
        image_seq_len,
        base_seq_len=base_seq_len,
        max_seq_len=max_seq_len,
        base_shift=base_shift,
        max_shift=max_shift,
    )
    base = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64)
    shifted = math.exp(mu) / (math.exp(mu) + (1.0 / base - 1.0))
    return torch.cat([shifted, shifted.new_zeros(1)]).float()
