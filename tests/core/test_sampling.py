from __future__ import annotations

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from torch import Tensor

from flowpost.core.sampling.checks import STEP_STD_BOUND, check_sde_steps, sde_step_problems
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.sampling.ode import dpm2_step, euler_step
from flowpost.core.sampling.schedules import inference_sigmas, logit_normal_sigmas, shift_sigmas
from flowpost.core.sampling.sde import step_std
from flowpost.errors import FlowpostError

# -- schedules ------------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 2, 7, 20, 50])
@pytest.mark.parametrize("shift", [1.0, 0.5, 3.0])
def test_inference_sigmas_run_from_one_to_exactly_zero(steps: int, shift: float) -> None:
    sigmas = inference_sigmas(steps, shift=shift)
    assert sigmas.dtype == torch.float32
    assert sigmas.shape == (steps + 1,)
    assert float(sigmas[0]) == 1.0
    assert float(sigmas[-1]) == 0.0
    assert bool((sigmas[1:] < sigmas[:-1]).all())


def test_unshifted_sigmas_are_linspace() -> None:
    sigmas = inference_sigmas(10)
    expected = torch.tensor([1.0 - i / 10 for i in range(11)], dtype=torch.float32)
    torch.testing.assert_close(sigmas, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("shift", [0.25, 2.0, 3.0, 6.0])
def test_shifted_sigmas_match_closed_form(shift: float) -> None:
    steps = 12
    sigmas = inference_sigmas(steps, shift=shift)
    for i in range(steps + 1):
        t = 1.0 - i / steps
        expected = shift * t / (1.0 + (shift - 1.0) * t)
        assert float(sigmas[i]) == pytest.approx(expected, abs=1e-6)


def test_shift_above_one_moves_sigmas_up() -> None:
    plain = inference_sigmas(8)
    shifted = inference_sigmas(8, shift=3.0)
    assert bool((shifted[1:-1] > plain[1:-1]).all())


def test_zero_steps_is_rejected() -> None:
    with pytest.raises(ValueError):
        inference_sigmas(0)


def test_logit_normal_at_zero_normal_is_shifted_sigmoid_of_mean() -> None:
    zeros = torch.zeros(3)
    for mean, shift in [(0.0, 1.0), (0.7, 1.0), (-1.2, 3.0), (0.4, 0.5)]:
        base = 1.0 / (1.0 + torch.exp(torch.tensor(-mean)))
        expected = shift * base / (1.0 + (shift - 1.0) * base)
        out = logit_normal_sigmas(zeros, mean=mean, std=2.0, shift=shift)
        torch.testing.assert_close(out, expected.expand(3), rtol=0, atol=1e-6)


def test_logit_normal_scales_normals_by_std() -> None:
    normals = torch.tensor([-1.0, 0.5, 2.0])
    out = logit_normal_sigmas(normals, mean=0.3, std=0.5)
    torch.testing.assert_close(out, torch.sigmoid(0.3 + 0.5 * normals))
    # strictly inside (0, 1) and monotone in the normal draw
    assert bool(((out > 0) & (out < 1)).all())
    assert bool((out[1:] > out[:-1]).all())


def test_shift_sigmas_is_identity_at_one_and_fixes_endpoints() -> None:
    sigmas = torch.rand(16, dtype=torch.float64)
    torch.testing.assert_close(shift_sigmas(sigmas, 1.0), sigmas)
    ends = torch.tensor([0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(shift_sigmas(ends, 4.0), ends)


# -- the Euler step against diffusers -------------------------------------------------------------


def _compare_with_diffusers(scheduler: FlowMatchEulerDiscreteScheduler, sigmas: torch.Tensor) -> None:
    torch.testing.assert_close(scheduler.sigmas, sigmas, rtol=0, atol=1e-6)
    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(2, 1, 8, 8, generator=gen)
    theirs = sample.clone()
    ours = sample.clone()
    for i, timestep in enumerate(scheduler.timesteps):
        model_output = torch.randn(2, 1, 8, 8, generator=gen)
        theirs = scheduler.step(model_output, timestep, theirs).prev_sample
        ours = euler_step(model_output, ours, sigmas[i], sigmas[i + 1])
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    # the walk really moved the sample
    assert not torch.allclose(ours, sample)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_euler_step_matches_diffusers_on_our_sigmas(shift: float) -> None:
    steps = 6
    sigmas = inference_sigmas(steps, shift=shift)
    # shift=1 in the scheduler: it uses our (already shifted) sigmas as given and appends 0
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)
    scheduler.set_timesteps(sigmas=sigmas[:-1].tolist())
    _compare_with_diffusers(scheduler, sigmas)


def test_diffusers_own_shift_agrees_with_ours() -> None:
    steps = 5
    shift = 3.0
    sigmas = inference_sigmas(steps, shift=shift)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    unshifted = torch.linspace(1.0, 0.0, steps + 1)[:-1]
    scheduler.set_timesteps(sigmas=unshifted.tolist())
    _compare_with_diffusers(scheduler, sigmas)


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("steps", [4, 10])
def test_the_tiny_grid_is_the_scheduler_given_linspace_sigmas(steps: int, shift: float) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(sigmas=torch.linspace(1.0, 0.0, steps + 1)[:-1].tolist())
    ours = inference_sigmas(steps, shift=shift)
    torch.testing.assert_close(scheduler.sigmas, ours, rtol=1e-6, atol=1e-7)  # diffusers shifts in fp32
    torch.testing.assert_close(scheduler.timesteps, 1000.0 * ours[:-1], rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_the_tiny_grid_differs_from_the_scheduler_default(shift: float) -> None:
    steps = 10
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    sigma_min = float(shift_sigmas(torch.tensor(1 / 1000, dtype=torch.float64), shift))  # smallest training sigma
    assert scheduler.sigma_min == pytest.approx(sigma_min, rel=1e-6)
    inner = shift_sigmas(torch.linspace(1.0, sigma_min, steps, dtype=torch.float64), shift).float()
    torch.testing.assert_close(scheduler.sigmas, torch.cat([inner, torch.zeros(1)]), rtol=1e-6, atol=1e-7)
    ours = inference_sigmas(steps, shift=shift)
    assert scheduler.sigmas[0] == ours[0] == 1.0 and scheduler.sigmas[-1] == ours[-1] == 0.0
    assert bool(((scheduler.sigmas[1:-1] - ours[1:-1]).abs() > 1e-3).all())  # every inner sigma moves
    last_step_start = float(shift_sigmas(torch.tensor(1 / steps, dtype=torch.float64), shift))
    assert float(scheduler.sigmas[-2]) < 0.01 and float(ours[-2]) == pytest.approx(last_step_start)


def test_euler_step_computes_in_fp32_and_keeps_dtype() -> None:
    sample = torch.randn(4, 3, dtype=torch.float64)
    velocity = torch.randn(4, 3, dtype=torch.float64)
    out = euler_step(velocity, sample, 0.8, 0.6)
    assert out.dtype == torch.float64
    expected = (sample.float() - 0.2 * velocity.float()).double()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    half = euler_step(velocity.bfloat16(), sample.bfloat16(), torch.tensor(1.0), torch.tensor(0.0))
    assert half.dtype == torch.bfloat16


def test_euler_integration_of_constant_velocity_reaches_data() -> None:
    # x_sigma = (1 - sigma) x0 + sigma * noise has velocity noise - x0 for every sigma
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(3, 5, generator=gen)
    noise = torch.randn(3, 5, generator=gen)
    sigmas = inference_sigmas(9, shift=2.5)
    sample = noise
    for sigma, sigma_next in zip(sigmas[:-1], sigmas[1:], strict=True):
        sample = euler_step(noise - x0, sample, sigma, sigma_next)
    torch.testing.assert_close(sample, x0, rtol=0, atol=1e-5)


def _lam(sigma: float) -> float:
    return math.log((1.0 - sigma) / sigma)


@pytest.mark.parametrize(("sigma", "sigma_next"), [(1.0, 0.9), (0.8, 0.6), (0.3, 0.05), (0.2, 0.0)])
def test_first_order_dpm2_is_the_euler_step(sigma: float, sigma_next: float) -> None:
    gen = torch.Generator().manual_seed(2)
    sample, velocity = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    out = dpm2_step(sample - sigma * velocity, sample, sigma, sigma_next)
    torch.testing.assert_close(out, euler_step(velocity, sample, sigma, sigma_next), rtol=0, atol=1e-6)


def test_second_order_dpm2_is_the_multistep_midpoint_formula() -> None:
    gen = torch.Generator().manual_seed(3)
    sample, x0, prev_x0 = (torch.randn(2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    prev_sigma, sigma, sigma_next = 0.7, 0.5, 0.35
    h, h_prev = _lam(sigma_next) - _lam(sigma), _lam(sigma) - _lam(prev_sigma)
    d1 = (x0 - prev_x0) * h / h_prev
    factor = (1.0 - sigma_next) * (math.exp(-h) - 1.0)
    expected = (sigma_next / sigma) * sample - factor * x0 - 0.5 * factor * d1
    out = dpm2_step(x0, sample, sigma, sigma_next, (prev_x0, prev_sigma))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    # first order from a previous sigma of 1 (no finite lambda) and into 0 (the data prediction)
    torch.testing.assert_close(
        dpm2_step(x0, sample, sigma, sigma_next, (prev_x0, 1.0)), dpm2_step(x0, sample, sigma, sigma_next)
    )
    torch.testing.assert_close(dpm2_step(x0, sample, sigma, 0.0, (prev_x0, prev_sigma)), x0.float().double())
    half = dpm2_step(x0.bfloat16(), sample.bfloat16(), sigma, sigma_next, (prev_x0.bfloat16(), prev_sigma))
    assert half.dtype == torch.bfloat16


def _integrate(solver: str, z: Tensor, sigmas: Tensor, mean: float, std: float) -> Tensor:
    """The flow ODE of data ``N(mean, std^2)`` from ``z`` at sigma 1, with its exact data prediction."""

    def x0_hat(x: Tensor, sigma: float) -> Tensor:
        alpha = 1.0 - sigma
        return mean + alpha * std**2 / (alpha**2 * std**2 + sigma**2) * (x - alpha * mean)

    x, previous = z, None
    for sigma, sigma_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist(), strict=True):
        data = x0_hat(x, sigma)
        if solver == "dpm2":
            x, previous = dpm2_step(data, x, sigma, sigma_next, previous), (data, sigma)
        else:
            x = euler_step((x - data) / sigma, x, sigma, sigma_next)
    return x


def test_dpm2_solves_a_gaussian_flow_to_second_order_where_euler_is_first() -> None:
    # data N(m, s^2): the ODE carries noise z to exactly m + s z
    mean, std = 0.8, 0.3
    z = torch.randn(2000, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    exact = mean + std * z
    errors = {
        (solver, steps): float((_integrate(solver, z, inference_sigmas(steps).double(), mean, std) - exact).abs().max())
        for solver in ("euler", "dpm2")
        for steps in (10, 25)
    }
    assert errors["dpm2", 25] < errors["euler", 25] / 4
    assert errors["euler", 10] / errors["euler", 25] < 3.0  # first order: 2.5x the steps, ~2.5x less error
    assert errors["dpm2", 10] / errors["dpm2", 25] > 4.5  # second order: ~6x less


# -- load-time checks of SDE steps ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"steps": 10}, range(0, 9)),
        ({"steps": 10, "window": 3}, range(0, 9)),
        ({"steps": 10, "window": 3, "window_start": (2, 4)}, range(2, 7)),
        ({"steps": 6, "window": 1, "window_start": (2, 2)}, range(2, 3)),
    ],
)
def test_sde_steps_are_every_step_a_window_may_hold(settings: dict, expected: range) -> None:
    assert SamplingConfig.model_validate(settings).sde_steps == expected


@pytest.mark.parametrize("dynamics", ["flow-sde", "dance-sde", "cps"])
@pytest.mark.parametrize("noise_level", [0.3, 0.7, 1.0, 1.5])
@pytest.mark.parametrize("shift", [1.0, 3.0, 10.0])
@pytest.mark.parametrize("steps", [5, 10, 50])
def test_healthy_grids_pass_the_step_check(dynamics: str, noise_level: float, shift: float, steps: int) -> None:
    sampling = SamplingConfig(dynamics=dynamics, noise_level=noise_level, steps=steps)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    for sigmas in (inference_sigmas(steps, shift=shift), scheduler.sigmas.float()):
        assert sde_step_problems(sigmas, sampling, needs_noise=True) == []


def test_a_first_sigma_near_but_not_at_one_is_named_with_its_std() -> None:
    sigmas = inference_sigmas(10, shift=3.0)
    sigmas[0] = 1.0 - 3e-4
    (problem,) = sde_step_problems(sigmas, SamplingConfig(), needs_noise=False)
    assert "step 0 (0.9997 -> " in problem and "window_start" in problem and "step 1 " not in problem
    assert STEP_STD_BOUND * 0.7 < float(step_std("flow-sde", sigmas[0], sigmas[1], 0.7))
    assert sde_step_problems(sigmas, SamplingConfig(window=2, window_start=(1, 7)), needs_noise=False) == []
    with pytest.raises(FlowpostError, match=r"^stages\.grpo\.sampling: .*step 0") as raised:
        check_sde_steps(sigmas, SamplingConfig(), stage="grpo", needs_noise=True)
    assert raised.value.where == "stages.grpo.sampling"


def test_zero_std_is_a_problem_only_where_noise_is_needed() -> None:
    sigmas, ode = inference_sigmas(10), SamplingConfig(dynamics="ode")
    assert sde_step_problems(sigmas, ode, needs_noise=False) == []
    (problem,) = sde_step_problems(sigmas, ode, needs_noise=True)
    assert "zero transition std" in problem
