from __future__ import annotations

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from one_device import OneDevice
from torch.distributions import Normal, kl_divergence

from flowpost.core.sampling.schedules import inference_sigmas
from flowpost.core.sampling.sde import (
    DYNAMICS,
    SIGMA_ONE_TOLERANCE,
    gaussian_kl_mean,
    noise_scale,
    sde_step,
    step_std,
)

STOCHASTIC = ("flow-sde", "dance-sde", "cps")
SHAPE = (3, 4, 6, 5)


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sample = torch.randn(SHAPE, generator=gen).to(dtype)
    model_output = torch.randn(SHAPE, generator=gen).to(dtype)
    return sample, model_output


def _noise(seed: int = 1) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


# -- closed forms, written independently of the module (float64) ---------------------------------


def _flow_sde_reference(x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float, a: float):
    x, v = x.double(), v.double()
    delta = sigma - sigma_next
    g = a * math.sqrt(sigma / (1 - sigma)) if sigma < 1 else a * math.sqrt(1 / (1 - sigma_next))
    mean = x * (1 - g**2 * delta / (2 * sigma)) - delta * v * (1 + g**2 * (1 - sigma) / (2 * sigma))
    return mean, g * math.sqrt(delta)


def _dance_sde_reference(x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float, eta: float):
    x, v = x.double(), v.double()
    delta = sigma - sigma_next
    x0_hat = x - sigma * v
    mean = x - delta * (v + eta**2 / (2 * sigma**2) * (x - (1 - sigma) * x0_hat))
    return mean, eta * math.sqrt(delta)


def _cps_reference(x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float, eta: float):
    x, v = x.double(), v.double()
    x0_hat, eps_hat = x - sigma * v, x + (1 - sigma) * v
    s = sigma_next * math.sin(eta * math.pi / 2)
    mean = (1 - sigma_next) * x0_hat + math.sqrt(max(sigma_next**2 - s**2, 0.0)) * eps_hat
    return mean, s


REFERENCES = {"flow-sde": _flow_sde_reference, "dance-sde": _dance_sde_reference, "cps": _cps_reference}


# -- ODE ----------------------------------------------------------------------------------------------


def test_ode_is_euler_with_zero_std_and_log_prob() -> None:
    x, v = _inputs()
    out = sde_step("ode", v, x, 0.8, 0.55)
    torch.testing.assert_close(out.prev_sample, x + (0.55 - 0.8) * v, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.mean, x + (0.55 - 0.8) * v, rtol=0, atol=1e-6)
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0]))
    assert bool((out.std == 0).all())


def test_ode_matches_diffusers_euler_loop() -> None:
    sigmas = inference_sigmas(6, shift=3.0)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)
    scheduler.set_timesteps(sigmas=sigmas[:-1].tolist())
    ours, _ = _inputs()
    theirs = ours.clone()
    for i, timestep in enumerate(scheduler.timesteps):
        model_output = torch.tanh(ours) + float(sigmas[i])
        theirs = scheduler.step(model_output, timestep, theirs).prev_sample
        ours = sde_step("ode", model_output, ours, sigmas[i], sigmas[i + 1]).prev_sample
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


# -- means and stds against closed forms ----------------------------------------------------------


@pytest.mark.parametrize("dynamics", STOCHASTIC)
@pytest.mark.parametrize(("sigma", "sigma_next"), [(0.9, 0.8), (0.6, 0.25), (0.3, 0.05), (1.0, 0.85)])
@pytest.mark.parametrize("noise_level", [0.3, 0.7, 0.8])
def test_mean_and_std_match_closed_forms(dynamics: str, sigma: float, sigma_next: float, noise_level: float) -> None:
    x, v = _inputs(seed=int(100 * sigma + 10 * noise_level))
    out = sde_step(dynamics, v, x, sigma, sigma_next, noise_level=noise_level, noise=_noise())
    mean, std = REFERENCES[dynamics](x, v, sigma, sigma_next, noise_level)
    torch.testing.assert_close(out.mean.double(), mean, rtol=1e-5, atol=1e-5)
    assert float(out.std) == pytest.approx(std, rel=1e-6)
    assert out.mean.dtype == torch.float32 and out.std.dtype == torch.float32
    assert torch.equal(step_std(dynamics, sigma, sigma_next, noise_level), out.std)


def test_flow_sde_at_sigma_one_uses_next_sigma_in_denominator() -> None:
    x, v = _inputs()
    a, sigma_next = 0.7, 0.9
    out = sde_step("flow-sde", v, x, 1.0, sigma_next, noise_level=a, noise=_noise())
    g = float(out.std) / math.sqrt(1.0 - sigma_next)
    assert math.isfinite(g)
    assert g == pytest.approx(a * math.sqrt(1.0 / (1.0 - sigma_next)), rel=1e-6)
    assert bool(out.mean.isfinite().all()) and bool(out.log_prob.isfinite().all())


UNIPC_FIRST = float(torch.tensor(1.0 - 1e-6, dtype=torch.float32))  # diffusers' UniPC flow grids start here


@pytest.mark.parametrize("sigma", [UNIPC_FIRST, 1.0 - SIGMA_ONE_TOLERANCE])
def test_flow_sde_just_below_sigma_one_is_the_sigma_one_step(sigma: float) -> None:
    a, sigma_next = 0.7, 0.9643
    scale = float(noise_scale("flow-sde", sigma, sigma_next, a))
    assert scale == pytest.approx(a * math.sqrt(sigma / (1.0 - sigma_next)), rel=1e-6)
    assert float(step_std("flow-sde", sigma, sigma_next, a)) == pytest.approx(a, rel=1e-3)  # not ~131


def test_flow_sde_outside_the_tolerance_keeps_its_own_denominator() -> None:
    sigma = 1.0 - 10 * SIGMA_ONE_TOLERANCE  # 1 - sigma is rounded in fp32
    expected = 0.7 * math.sqrt(sigma / (1 - sigma))
    assert float(noise_scale("flow-sde", sigma, 0.9, 0.7)) == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize(("steps", "shift"), [(10, 1.0), (10, 3.0), (50, 5.0), (1000, 3.0)])
def test_flow_sde_scale_is_unchanged_on_grids_starting_at_one(steps: int, shift: float) -> None:
    """Bit for bit: exactly 1 as before, every other sigma by ``a sqrt(sigma / (1 - sigma))``."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    for sigmas in (scheduler.sigmas.float(), inference_sigmas(steps, shift=shift)):
        sigma, sigma_next = sigmas[:-2], sigmas[1:-1]
        before = torch.where(sigma >= 1.0, 1.0 - sigma_next, 1.0 - sigma)
        assert torch.equal(noise_scale("flow-sde", sigma, sigma_next, 0.7), 0.7 * torch.sqrt(sigma / before))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nudged_first_step_replays_exactly_and_stays_on_the_latents_device(dtype: torch.dtype) -> None:
    x, v = _inputs(dtype=dtype)
    per_sample = torch.full((SHAPE[0],), UNIPC_FIRST), torch.full((SHAPE[0],), 0.9643)
    out = sde_step("flow-sde", v, x, *per_sample, noise=_noise())
    replay = sde_step("flow-sde", v, x, *per_sample, prev_sample=out.prev_sample)
    assert out.prev_sample.dtype == dtype and out.std.dtype == torch.float32
    assert torch.equal(replay.log_prob, out.log_prob) and bool(out.log_prob.isfinite().all())
    assert float(out.std.max()) < 1.0
    meta = torch.device("meta")
    with OneDevice():
        on_meta = sde_step("flow-sde", v.to(meta), x.to(meta), *per_sample, noise=_noise().to(meta))
    assert {t.device for t in (on_meta.prev_sample, on_meta.mean, on_meta.std, on_meta.log_prob)} == {meta}


def test_dance_sde_is_flow_sde_formula_with_constant_scale() -> None:
    x, v = _inputs()
    dance = sde_step("dance-sde", v, x, 0.5, 0.4, noise_level=0.3, noise=_noise())
    # flow-sde's g at sigma = 0.5 equals its noise level, so the two coincide there
    flow = sde_step("flow-sde", v, x, 0.5, 0.4, noise_level=0.3, noise=_noise())
    torch.testing.assert_close(dance.mean, flow.mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(dance.std, flow.std, rtol=0, atol=1e-7)


# -- log-probs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamics", STOCHASTIC)
def test_log_prob_is_normalized_normal_density_mean(dynamics: str) -> None:
    x, v = _inputs()
    out = sde_step(dynamics, v, x, 0.7, 0.4, noise=_noise())
    expected = Normal(out.mean, out.std.expand(SHAPE)).log_prob(out.prev_sample).mean(dim=(1, 2, 3))
    assert out.log_prob.shape == (SHAPE[0],) and out.log_prob.dtype == torch.float32
    torch.testing.assert_close(out.log_prob, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dynamics", DYNAMICS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replaying_prev_sample_reproduces_log_prob_exactly(dynamics: str, dtype: torch.dtype) -> None:
    x, v = _inputs(dtype=dtype)
    gen = torch.Generator().manual_seed(3)
    out = sde_step(dynamics, v, x, 0.7, 0.4, generator=gen)
    assert out.prev_sample.dtype == dtype
    replay = sde_step(dynamics, v, x, 0.7, 0.4, prev_sample=out.prev_sample)
    assert torch.equal(replay.prev_sample, out.prev_sample)
    assert torch.equal(replay.log_prob, out.log_prob)
    assert torch.equal(replay.mean, out.mean)


def test_bf16_log_prob_scores_the_rounded_sample() -> None:
    x, v = _inputs(dtype=torch.bfloat16)
    out = sde_step("flow-sde", v, x, 0.7, 0.4, noise=_noise())
    expected = Normal(out.mean, out.std.expand(SHAPE)).log_prob(out.prev_sample.float()).mean(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, expected, rtol=0, atol=1e-5)


def test_replay_scores_a_different_sample_lower_when_far_from_mean() -> None:
    x, v = _inputs()
    out = sde_step("dance-sde", v, x, 0.7, 0.4, noise=_noise())
    far = sde_step("dance-sde", v, x, 0.7, 0.4, prev_sample=out.mean + 5 * out.std)
    assert bool((far.log_prob < out.log_prob).all())


# -- sampling ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamics", STOCHASTIC)
def test_given_noise_is_deterministic(dynamics: str) -> None:
    x, v = _inputs()
    noise = _noise()
    first = sde_step(dynamics, v, x, 0.7, 0.4, noise=noise)
    second = sde_step(dynamics, v, x, 0.7, 0.4, noise=noise)
    assert torch.equal(first.prev_sample, second.prev_sample)
    assert torch.equal(first.prev_sample, first.mean + first.std * noise)
    assert not torch.equal(first.prev_sample, first.mean)


def test_generator_draws_are_reproducible() -> None:
    x, v = _inputs()
    a = sde_step("cps", v, x, 0.7, 0.4, generator=torch.Generator().manual_seed(5))
    b = sde_step("cps", v, x, 0.7, 0.4, generator=torch.Generator().manual_seed(5))
    c = sde_step("cps", v, x, 0.7, 0.4, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.prev_sample, b.prev_sample)
    assert not torch.equal(a.prev_sample, c.prev_sample)


@pytest.mark.parametrize("dynamics", STOCHASTIC)
def test_draws_have_the_stated_mean_and_std(dynamics: str) -> None:
    x, v = _inputs()
    gen = torch.Generator().manual_seed(11)
    draws = torch.stack([sde_step(dynamics, v, x, 0.8, 0.5, generator=gen).prev_sample for _ in range(400)])
    out = sde_step(dynamics, v, x, 0.8, 0.5, noise=_noise())
    std = float(out.std)
    mean_error = (draws.mean(dim=0) - out.mean).abs().max()
    assert float(mean_error) < 5 * std / math.sqrt(400)
    assert float(draws.std(dim=0).mean()) == pytest.approx(std, rel=0.03)


# -- per-sample sigmas -------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamics", DYNAMICS)
def test_per_sample_sigmas_match_row_by_row(dynamics: str) -> None:
    x, v = _inputs()
    noise = _noise()
    sigma = torch.tensor([1.0, 0.6, 0.3])
    sigma_next = torch.tensor([0.9, 0.2, 0.0])
    out = sde_step(dynamics, v, x, sigma, sigma_next, noise=noise)
    for i in range(SHAPE[0]):
        row = slice(i, i + 1)
        single = sde_step(dynamics, v[row], x[row], float(sigma[i]), float(sigma_next[i]), noise=noise[row])
        torch.testing.assert_close(out.prev_sample[row], single.prev_sample, rtol=0, atol=1e-6)
        torch.testing.assert_close(out.mean[row], single.mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(out.log_prob[row], single.log_prob, rtol=0, atol=1e-5)
        assert float(out.std[i].squeeze()) == pytest.approx(float(single.std), abs=1e-7)


# -- CPS ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sigma", "sigma_next", "eta"), [(0.9, 0.6, 0.8), (0.5, 0.3, 0.5), (1.0, 0.7, 1.0)])
def test_cps_preserves_coefficients(sigma: float, sigma_next: float, eta: float) -> None:
    gen = torch.Generator().manual_seed(7)
    x0 = torch.randn(1, 4, 64, 64, generator=gen)
    eps = torch.randn(1, 4, 64, 64, generator=gen)
    x = (1 - sigma) * x0 + sigma * eps
    v = eps - x0
    out = sde_step("cps", v, x, sigma, sigma_next, noise_level=eta, generator=gen)
    expected_mean = (1 - sigma_next) * x0 + sigma_next * math.cos(eta * math.pi / 2) * eps
    torch.testing.assert_close(out.mean, expected_mean, rtol=0, atol=1e-5)
    # regress the mean's noise coefficient; with the step std it makes up sigma_next^2
    residual = out.mean - (1 - sigma_next) * x0
    coefficient = float((residual * eps).sum() / (eps * eps).sum())
    assert coefficient**2 + float(out.std) ** 2 == pytest.approx(sigma_next**2, rel=1e-5)
    # so x' is (1 - sigma_next) x0 plus noise of variance sigma_next^2
    noise_part = out.prev_sample - (1 - sigma_next) * x0
    assert float(noise_part.var()) == pytest.approx(sigma_next**2, rel=0.05)


def test_flow_sde_does_not_preserve_coefficients() -> None:
    gen = torch.Generator().manual_seed(7)
    x0 = torch.randn(1, 4, 64, 64, generator=gen)
    eps = torch.randn(1, 4, 64, 64, generator=gen)
    sigma, sigma_next = 0.9, 0.6
    out = sde_step("flow-sde", eps - x0, (1 - sigma) * x0 + sigma * eps, sigma, sigma_next, generator=gen)
    noise_part = out.prev_sample - (1 - sigma_next) * x0
    assert float(noise_part.var()) > 1.2 * sigma_next**2


def test_cps_last_step_is_deterministic_with_zero_log_prob() -> None:
    x, v = _inputs()
    model_output = v.clone().requires_grad_(True)
    out = sde_step("cps", model_output, x, 0.2, 0.0, noise_level=0.8, noise=_noise())
    assert float(out.std) == 0.0
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0]))
    torch.testing.assert_close(out.prev_sample, x - 0.2 * v, rtol=0, atol=1e-6)
    out.log_prob.sum().backward()
    assert model_output.grad is not None and bool(model_output.grad.isfinite().all())


def test_cps_mixed_last_and_inner_steps() -> None:
    x, v = _inputs()
    out = sde_step("cps", v, x, torch.tensor([0.2, 0.6, 0.9]), torch.tensor([0.0, 0.3, 0.0]), noise=_noise())
    assert bool(out.log_prob.isfinite().all())
    assert float(out.log_prob[0]) == 0.0 and float(out.log_prob[2]) == 0.0
    assert float(out.log_prob[1]) != 0.0


# -- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamics", DYNAMICS)
@pytest.mark.parametrize(("sigma", "sigma_next"), [(0.5, 0.5), (0.4, 0.6)])
def test_non_decreasing_step_is_rejected(dynamics: str, sigma: float, sigma_next: float) -> None:
    x, v = _inputs()
    with pytest.raises(ValueError, match="smaller"):
        sde_step(dynamics, v, x, sigma, sigma_next)


def test_per_sample_non_decreasing_step_is_rejected() -> None:
    x, v = _inputs()
    with pytest.raises(ValueError):
        sde_step("flow-sde", v, x, torch.tensor([0.9, 0.5, 0.7]), torch.tensor([0.8, 0.5, 0.1]))


@pytest.mark.parametrize(("sigma", "sigma_next"), [(1.2, 0.9), (0.3, -0.1)])
def test_sigmas_outside_unit_interval_are_rejected(sigma: float, sigma_next: float) -> None:
    x, v = _inputs()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        sde_step("flow-sde", v, x, sigma, sigma_next)


def test_unknown_dynamics_names_the_allowed_ones() -> None:
    x, v = _inputs()
    with pytest.raises(ValueError) as info:
        sde_step("ddim", v, x, 0.5, 0.4)
    assert all(name in str(info.value) for name in DYNAMICS)
    with pytest.raises(ValueError, match="flow-sde"):
        step_std("ddim", 0.5, 0.4, 0.7)


def test_noise_of_the_wrong_shape_is_rejected() -> None:
    x, v = _inputs()
    with pytest.raises(ValueError, match="shape"):
        sde_step("flow-sde", v, x, 0.5, 0.4, noise=torch.zeros(1, 4, 6, 5))


# -- gradients ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamics", STOCHASTIC)
def test_log_prob_differentiates_to_model_output_not_prev_sample(dynamics: str) -> None:
    x, v = _inputs()
    rollout = sde_step(dynamics, v, x, 0.7, 0.4, noise=_noise())
    model_output = (v + 0.01).requires_grad_(True)
    stored = rollout.prev_sample.clone().requires_grad_(True)
    replay = sde_step(dynamics, model_output, x, 0.7, 0.4, prev_sample=stored)
    replay.log_prob.sum().backward()
    assert model_output.grad is not None
    assert bool(model_output.grad.isfinite().all()) and bool((model_output.grad != 0).any())
    assert stored.grad is None


# -- KL helper ----------------------------------------------------------------------------------------


def test_gaussian_kl_mean_matches_torch_kl() -> None:
    a, b = _inputs()
    std = torch.tensor([0.3, 0.1, 0.7]).reshape(3, 1, 1, 1)
    expected = kl_divergence(Normal(a, std.expand(SHAPE)), Normal(b, std.expand(SHAPE))).mean(dim=(1, 2, 3))
    torch.testing.assert_close(gaussian_kl_mean(a, b, std), expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(gaussian_kl_mean(a, a, 0.5), torch.zeros(3))


@pytest.mark.parametrize(("sigma", "sigma_next"), [(1.0, 0.9), (0.6, 0.45), (0.2, 0.1)])
def test_flow_grpo_kl_scale_is_the_exact_kl_times_the_step_size(sigma: float, sigma_next: float) -> None:
    x, v = _inputs()
    delta = sigma - sigma_next
    a = 0.7
    g = a * math.sqrt(sigma / (1 - (sigma_next if sigma == 1 else sigma)))  # Flow-GRPO's std_dev_t
    for dynamics, expected_g, factor in [("flow-sde", g, delta), ("dance-sde", a, delta), ("cps", None, 1.0)]:
        policy = sde_step(dynamics, v, x, sigma, sigma_next, noise_level=a, noise=_noise())
        reference = sde_step(dynamics, v + 0.05 * _noise(2), x, sigma, sigma_next, noise_level=a, noise=_noise())
        scale = noise_scale(dynamics, sigma, sigma_next, a)
        if expected_g is not None:
            assert float(scale) == pytest.approx(expected_g, rel=1e-6)
        exact = gaussian_kl_mean(policy.mean, reference.mean, policy.std)
        flow_grpo = gaussian_kl_mean(policy.mean, reference.mean, scale)
        assert bool((exact > 0).all())
        torch.testing.assert_close(flow_grpo, exact * factor, rtol=1e-5, atol=0.0)
    assert float(noise_scale("ode", sigma, sigma_next, a)) == 0.0
