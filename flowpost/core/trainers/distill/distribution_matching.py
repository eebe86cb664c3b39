"""The math of distribution-matching distillation (DMD2, TDM), as pure functions on latents.

Convention: ``x_sigma = (1 - sigma) x0 + sigma eps``; a velocity ``v`` implies ``x0_hat = x - sigma v``
and ``eps_hat = x0_hat + v``. Per-sample means run over the non-batch elements.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _per_sample(value: Tensor, like: Tensor) -> Tensor:
    """A [B] tensor shaped to broadcast against ``like`` [B, ...]."""
    return value.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def x0_from_velocity(x: Tensor, sigma: Tensor, velocity: Tensor) -> Tensor:
    """``x - sigma v`` with per-sample sigma [B]."""
    return x - _per_sample(sigma, x) * velocity


def dmd_gradient(x0: Tensor, x0_real: Tensor, x0_fake: Tensor) -> Tensor:
    """``(x0_fake - x0_real) / <|x0 - x0_real|>`` per sample, non-finite entries zeroed: the direction of
    the reverse-KL gradient (the fake minus the real score, in x0 space)."""
    scale = (x0 - x0_real).abs().flatten(1).mean(1)
    return torch.nan_to_num((x0_fake - x0_real) / _per_sample(scale, x0), nan=0.0, posinf=0.0, neginf=0.0)


def dmd_generator_loss(x0: Tensor, target: Tensor) -> Tensor:
    """Per-sample ``1/2 <(x0 - sg(target))^2>``; with ``target = x0 - gradient`` its gradient in ``x0`` is
    ``gradient / D``."""
    return 0.5 * (x0.float() - target.detach().float()).pow(2).flatten(1).mean(1)


def uniform_sigmas(uniform: Tensor, low: float, high: float) -> Tensor:
    """Uniforms in [0, 1) mapped onto [low, high)."""
    return low + (high - low) * uniform


def renoise_between(x_next: Tensor, sigma_next: Tensor, sigma_t: Tensor, zeta: Tensor) -> Tensor:
    """The forward transition of the linear flow from ``x_{sigma_next}`` up to ``sigma_t > sigma_next``:
    ``x_t = (alpha_t / alpha_next) x_next + b zeta`` with ``alpha = 1 - sigma``, ``c = alpha_t sigma_next /
    alpha_next`` and ``b = sqrt(sigma_t^2 - c^2)``."""
    alpha_t, alpha_next = 1.0 - sigma_t, 1.0 - sigma_next
    c = alpha_t * sigma_next / alpha_next
    b = (sigma_t.pow(2) - c.pow(2)).clamp_min(0).sqrt()
    return _per_sample(alpha_t / alpha_next, x_next) * x_next + _per_sample(b, zeta) * zeta


def mixed_noise(x_t: Tensor, x0: Tensor, sigma_t: Tensor) -> Tensor:
    """The noise ``eps_mix`` with ``x_t = (1 - sigma_t) x0 + sigma_t eps_mix``."""
    return (x_t - _per_sample(1.0 - sigma_t, x_t) * x0) / _per_sample(sigma_t, x_t)


def pseudo_huber(delta: Tensor, c: float) -> Tensor:
    """``sqrt(delta^2 + c^2) - c`` elementwise."""
    return (delta.pow(2) + c * c).sqrt() - c


def tdm_generator_loss(x0: Tensor, x0_real: Tensor, x0_fake: Tensor, *, huber_c: float | None) -> Tensor:
    """Per-sample ``<rho(x0 - sg(x0 + x0_real - x0_fake))> / sg(<|x0 - x0_real|>)``, ``rho`` the pseudo-Huber
    loss with ``huber_c`` or ``delta^2 / 2`` without."""
    x0 = x0.float()
    target = (x0 + x0_real.float() - x0_fake.float()).detach()
    delta = x0 - target
    rho = pseudo_huber(delta, huber_c) if huber_c is not None else 0.5 * delta.pow(2)
    scale = (x0 - x0_real.float()).abs().flatten(1).mean(1).detach().clamp_min(1e-8)
    return rho.flatten(1).mean(1) / scale


def tdm_fake_weights(sigma_t: Tensor, eps_mix: Tensor, zeta: Tensor, *, snr_cap: float, clip: float) -> Tensor:
    """Per-sample ``iota * min(SNR, snr_cap)``: ``SNR = (1 - sigma)^2 / sigma^2`` and the importance weight
    ``iota = exp(-<eps_mix^2> / 2 + <zeta^2> / 2)`` clipped to ``[1 / clip, clip]``."""
    snr = ((1.0 - sigma_t) / sigma_t).pow(2).clamp(max=snr_cap)
    log_iota = -0.5 * eps_mix.float().pow(2).flatten(1).mean(1) + 0.5 * zeta.float().pow(2).flatten(1).mean(1)
    return log_iota.exp().clamp(1.0 / clip, clip).to(snr.dtype) * snr
