"""Flow-matching sigma schedules."""

from __future__ import annotations

import torch
from torch import Tensor


def shift_sigmas(sigmas: Tensor, shift: float) -> Tensor:
    """SD3's constant shift: sigma -> s * sigma / (1 + (s - 1) * sigma); identity for s = 1."""
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def inference_sigmas(num_steps: int, *, shift: float = 1.0) -> Tensor:
    """``num_steps + 1`` decreasing sigmas from 1 to exactly 0: shift(linspace(1, 0, N + 1)), fp32."""
    if num_steps < 1:
        raise ValueError("num_steps must be at least 1")
    return shift_sigmas(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64), shift).float()


def logit_normal_sigmas(
    normals: Tensor, *, mean: float = 0.0, std: float = 1.0, shift: float = 1.0
) -> Tensor:
    """Training sigmas: ``shift(sigmoid(mean + std * n))`` for standard-normal draws ``n``."""
    return shift_sigmas(torch.sigmoid(mean + std * normals), shift)
