"""Stochastic sampler steps with Gaussian transition log-densities.

Convention: ``x_sigma = (1 - sigma) * x0 + sigma * eps``, the model predicts ``v ~ eps - x0``, and a
step goes from ``sigma`` to ``sigma_next < sigma``. Every step is a Gaussian transition
``x' ~ N(mean, std^2)`` (``std = 0`` for deterministic steps), computed in fp32.

``log_prob`` is the normalized Gaussian log-density of ``x'`` averaged over the non-batch elements,
for every stochastic dynamics. For CPS this differs from Flow-GRPO, which stores the unnormalized
``-<(x' - mean)^2>``: with the same ``std = s`` for both policies, a log-ratio here equals Flow-GRPO's
log-ratio divided by ``2 s^2``, so PPO clip ranges tuned there do not carry over unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

DYNAMICS = ("ode", "flow-sde", "dance-sde", "cps")

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)

SIGMA_ONE_TOLERANCE = 1e-5
"""A sigma this close to 1 is pure noise to Flow-SDE. diffusers' UniPC flow grids (Wan) start at
``1 - 1e-6`` (fp32 ``0.99999899``), where ``sigma / (1 - sigma)`` would give ``g ~ 700``. The second
sigma of a shifted ``N``-step grid sits about ``1 / (N shift)`` below 1, outside the tolerance while
``N shift < 1e5``, so every other step keeps its ``g``."""


@dataclass(frozen=True)
class StepOutput:
    """One sampler step.

    ``prev_sample`` is ``x'`` in the sample's dtype (detached); ``log_prob`` is ``[B]`` fp32 (zeros
    for deterministic steps); ``mean`` is the fp32 transition mean; ``std`` the fp32 transition std,
    broadcastable to the sample.
    """

    prev_sample: Tensor
    log_prob: Tensor
    mean: Tensor
    std: Tensor


def _check_dynamics(dynamics: str) -> None:
    if dynamics not in DYNAMICS:
        raise ValueError(f"unknown dynamics {dynamics!r}; expected one of {', '.join(DYNAMICS)}")


def _flow_sde_scale(sigma: Tensor, sigma_next: Tensor, noise_level: float) -> Tensor:
    """Flow-GRPO's ``g = a sqrt(sigma / (1 - sigma))``; the denominator is ``1 - sigma_next`` wherever
    sigma counts as 1 (``sigma >= 1 - SIGMA_ONE_TOLERANCE``)."""
    denominator = torch.where(sigma >= 1.0 - SIGMA_ONE_TOLERANCE, 1.0 - sigma_next, 1.0 - sigma)
    return noise_level * torch.sqrt(sigma / denominator)


def _sigma_pair(sigma: Tensor | float, sigma_next: Tensor | float) -> tuple[Tensor, Tensor]:
    """Both sigmas as fp32 tensors of one broadcast shape, on the first one's device."""
    sigma_t = torch.as_tensor(sigma, dtype=torch.float32)
    sigma_next_t = torch.as_tensor(sigma_next, dtype=torch.float32, device=sigma_t.device)
    sigma_t, sigma_next_t = torch.broadcast_tensors(sigma_t, sigma_next_t)
    return sigma_t, sigma_next_t


def noise_scale(dynamics: str, sigma: Tensor | float, sigma_next: Tensor | float, noise_level: float) -> Tensor:
    """Flow-GRPO's ``std_dev_t`` of one step (fp32, the broadcast shape of the sigmas).

    The SDE's diffusion coefficient ``g``, the transition std without its ``sqrt(sigma - sigma_next)``
    factor: ``ode``: 0; ``flow-sde``: ``noise_level * sqrt(sigma / (1 - sigma))`` (``1 - sigma_next`` in the
    denominator where sigma counts as 1, see ``SIGMA_ONE_TOLERANCE``); ``dance-sde``:
    ``noise_level``. CPS is not an SDE discretisation: its ``g`` is its std,
    ``sigma_next * sin(noise_level * pi / 2)``.
    """
    _check_dynamics(dynamics)
    sigma_t, sigma_next_t = _sigma_pair(sigma, sigma_next)
    if dynamics == "ode":
        return torch.zeros_like(sigma_t)
    if dynamics == "flow-sde":
        return _flow_sde_scale(sigma_t, sigma_next_t, noise_level)
    if dynamics == "dance-sde":
        return torch.full_like(sigma_t, noise_level)
    return sigma_next_t * math.sin(noise_level * math.pi / 2.0)


def step_std(dynamics: str, sigma: Tensor | float, sigma_next: Tensor | float, noise_level: float) -> Tensor:
    """Transition std of one step (fp32, the broadcast shape of the sigmas).

    ``noise_scale * sqrt(sigma - sigma_next)`` for ``flow-sde`` and ``dance-sde``; ``noise_scale``
    for ``ode`` (0) and ``cps`` (``sigma_next * sin(noise_level * pi / 2)``).
    """
    scale = noise_scale(dynamics, sigma, sigma_next, noise_level)
    if dynamics in ("ode", "cps"):
        return scale
    sigma_t, sigma_next_t = _sigma_pair(sigma, sigma_next)
    return scale * torch.sqrt(sigma_t - sigma_next_t)


def _sigma_like(sigma: Tensor | float, sample: Tensor) -> Tensor:
    """fp32 sigma on the sample's device; a 1-D per-sample ``[B]`` tensor becomes ``[B, 1, ...]``."""
    out = torch.as_tensor(sigma, dtype=torch.float32, device=sample.device)
    if out.ndim == 1 and sample.ndim > 1:
        out = out.reshape(-1, *([1] * (sample.ndim - 1)))
    return out


def _gaussian_log_prob(value: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-sample mean of the elementwise normal log-density; 0 wherever ``std == 0``."""
    safe_std = torch.where(std > 0, std, torch.ones_like(std))
    density = -((value - mean) ** 2) / (2.0 * safe_std**2) - torch.log(safe_std) - _HALF_LOG_TWO_PI
    density = torch.where(std > 0, density, torch.zeros_like(density))
    return density.flatten(1).mean(dim=1)


def sde_step(
    dynamics: str,
    model_output: Tensor,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    *,
    noise_level: float = 0.7,
    noise: Tensor | None = None,
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StepOutput:
    """One step ``sigma -> sigma_next`` of ``dynamics`` (one of ``DYNAMICS``).

    With ``v`` the model output, ``x_0_hat = x - sigma v`` and ``eps_hat = x + (1 - sigma) v``:

    - ``ode``: Euler, ``mean = x + (sigma_next - sigma) v``, std 0.
    - ``flow-sde`` (Flow-GRPO): ``g = a sqrt(sigma / (1 - sigma))`` with ``a = noise_level``; at
      ``sigma = 1`` the denominator uses the next sigma, ``g = a sqrt(sigma / (1 - sigma_next))`` (Flow-GRPO
      substitutes ``sigmas[1]``, the next grid point), and so does any sigma within
      ``SIGMA_ONE_TOLERANCE`` of 1 (UniPC's ``1 - 1e-6``). ``mean = x + (sigma_next - sigma)
      [v + g^2 / (2 sigma) eps_hat]``, ``std = g sqrt(sigma - sigma_next)``.
    - ``dance-sde`` (DanceGRPO): the same mean with constant ``g = noise_level``.
    - ``cps``: ``s = sigma_next sin(eta pi / 2)``, ``mean = (1 - sigma_next) x_0_hat +
      sigma_next cos(eta pi / 2) eps_hat``, ``std = s``; at ``sigma_next = 0`` the step is
      deterministic and its log_prob is 0.

    Sigmas are floats or tensors broadcastable to the sample; a 1-D ``[B]`` tensor is per sample.
    ``0 <= sigma_next < sigma <= 1`` is required (checked on host sigmas; device ones are trusted). If
    ``prev_sample`` is given it is scored as a constant (replay); otherwise ``x' = mean + std * noise`` with
    ``noise`` (standard normal, sample shape) or a fresh draw from ``generator``. ``x'`` is rounded to the
    sample's dtype before scoring, so replaying the returned ``prev_sample`` reproduces ``log_prob`` exactly.
    Gradients reach ``model_output`` through ``mean`` and ``log_prob``.
    """
    _check_dynamics(dynamics)
    given, given_next = _sigma_pair(sigma, sigma_next)
    if given.device.type == "cpu":  # a device copy is not read back (a sync): a replay's were checked when sampled
        if not bool((given_next < given).all()):
            raise ValueError("sigma_next must be smaller than sigma")
        if not (bool((given_next >= 0).all()) and bool((given <= 1).all())):
            raise ValueError("sigmas must lie in [0, 1]")
    if noise is not None and noise.shape != sample.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} does not match sample shape {tuple(sample.shape)}")
    sigma_t = _sigma_like(sigma, sample)
    sigma_next_t = _sigma_like(sigma_next, sample)

    x = sample.float()
    v = model_output.float()
    if dynamics == "cps":
        angle = noise_level * math.pi / 2.0
        mean = (1.0 - sigma_next_t) * (x - sigma_t * v) + sigma_next_t * math.cos(angle) * (x + (1.0 - sigma_t) * v)
    else:
        delta = sigma_next_t - sigma_t
        if dynamics == "ode":
            drift = v
        else:
            scale = noise_scale(dynamics, sigma_t, sigma_next_t, noise_level)
            drift = v + scale**2 / (2.0 * sigma_t) * (x + (1.0 - sigma_t) * v)
        mean = x + delta * drift
    std = step_std(dynamics, sigma_t, sigma_next_t, noise_level)

    if prev_sample is not None:
        prev = prev_sample.detach().to(sample.dtype)
    elif dynamics == "ode":
        prev = mean.detach().to(sample.dtype)
    else:
        if noise is None:
            noise = torch.randn(sample.shape, generator=generator, device=sample.device, dtype=torch.float32)
        prev = (mean.detach() + std * noise.float()).to(sample.dtype)

    if dynamics == "ode":
        log_prob = torch.zeros(sample.shape[0], dtype=torch.float32, device=sample.device)
    else:
        log_prob = _gaussian_log_prob(prev.float(), mean, std)
    return StepOutput(prev_sample=prev, log_prob=log_prob, mean=mean, std=std)


def gaussian_kl_mean(mean_a: Tensor, mean_b: Tensor, std: Tensor | float) -> Tensor:
    """Per-sample element-mean KL between ``N(mean_a, std^2)`` and ``N(mean_b, std^2)``: ``[B]`` fp32.

    ``<(mean_a - mean_b)^2 / (2 std^2)>``; ``std`` must be positive and broadcastable to the means.
    """
    std_t = torch.as_tensor(std, dtype=torch.float32, device=mean_a.device)
    kl = (mean_a.float() - mean_b.float()) ** 2 / (2.0 * std_t**2)
    return kl.flatten(1).mean(dim=1)
