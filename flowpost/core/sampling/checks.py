"""Load-time checks of a stage's SDE steps on the sigma grid it samples on."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.sampling.sde import step_std
from flowpost.errors import FlowpostError

STEP_STD_BOUND = 2.0
"""The largest transition std an SDE step may have, in units of ``max(1, noise_level)``.

On unit-variance latents a healthy step stays below it: Flow-SDE's std is ``a sqrt(sigma Delta / (1 -
sigma))``, about ``a`` or less on shifted grids (exactly ``a sqrt(sigma)`` at sigma = 1), Dance-SDE's
``eta sqrt(Delta) <= eta``, CPS's ``sigma_next sin(eta pi / 2) <= 1``. A first sigma just below 1 that
escapes the sigma = 1 rule gives ``a sqrt(Delta / (1 - sigma))``, tens to hundreds.
"""


def max_step_std(noise_level: float) -> float:
    """The bound on every SDE step's transition std: ``STEP_STD_BOUND * max(1, noise_level)``."""
    return STEP_STD_BOUND * max(1.0, noise_level)


def sde_step_problems(sigmas: Tensor, sampling: SamplingConfig, *, needs_noise: bool) -> list[str]:
    """What is wrong with the SDE steps of ``sampling`` on the grid ``sigmas`` (``steps + 1`` sigmas).

    Every step a window may hold (``SamplingConfig.sde_steps``) needs a finite std of at most
    ``max_step_std(noise_level)``; with ``needs_noise`` (objectives that score transition densities) also
    a positive one: a std below fp32 resolution of a unit-scale latent counts as zero (CPS with an even
    ``noise_level`` gives ``sin(k pi)``, zero up to rounding).
    """
    steps = sampling.sde_steps
    index = torch.tensor(list(steps), dtype=torch.long)
    grid = sigmas.detach().float().cpu()
    std = step_std(sampling.dynamics, grid[index], grid[index + 1], sampling.noise_level)
    problems = []
    if needs_noise and not bool((std > torch.finfo(torch.float32).eps).all()):
        problems.append(
            f"dynamics {sampling.dynamics!r} with noise_level {sampling.noise_level} gives its steps zero "
            "transition std; use flow-sde, dance-sde or cps with a noise_level that gives a positive std "
            "(e.g. flow-sde with 0.7)"
        )
    bound = max_step_std(sampling.noise_level)
    broken = [(j, s) for j, s in zip(steps, std.tolist(), strict=True) if not (math.isfinite(s) and s <= bound)]
    if broken:
        listed = ", ".join(
            f"step {j} ({float(grid[j]):.7g} -> {float(grid[j + 1]):.7g}): std {s:.3g}" for j, s in broken
        )
        problems.append(
            f"dynamics {sampling.dynamics!r} with noise_level {sampling.noise_level} gives SDE steps of the "
            f"{sampling.steps}-step sigma grid a transition std above {bound:g} "
            f"({STEP_STD_BOUND:g} x max(1, noise_level)) on unit-variance latents: {listed}; its rollouts would be "
            f"noise. Keep the SDE window past step {broken[-1][0]} (window and window_start), use dynamics "
            "cps, or another step count or scheduler"
        )
    return problems


def check_sde_steps(sigmas: Tensor, sampling: SamplingConfig, *, stage: str, needs_noise: bool) -> None:
    """Raise a ``FlowpostError`` naming ``stages.<stage>.sampling`` when ``sde_step_problems`` finds any."""
    problems = sde_step_problems(sigmas, sampling, needs_noise=needs_noise)
    if problems:
        raise FlowpostError("; ".join(problems), where=f"stages.{stage}.sampling")
