from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from flowpost.core.sampling.schedules import flux2_shift_mu, flux_shift_mu, flux_sigmas, shift_sigmas


def _linear_mu(seq_len: float) -> float:
    """diffusers' ``calculate_shift`` with FLUX's scheduler defaults, written as m * L + b."""
    m = (1.15 - 0.5) / (4096 - 256)
    b = 0.5 - m * 256
    return m * seq_len + b


@pytest.mark.parametrize("seq_len", [64, 256, 1024, 2304, 4096, 8192])
def test_mu_is_the_linear_interpolation(seq_len: int) -> None:
    assert flux_shift_mu(seq_len) == pytest.approx(_linear_mu(seq_len), abs=1e-12)


def test_mu_reference_values_and_no_clamping() -> None:
    assert flux_shift_mu(256) == pytest.approx(0.5, abs=1e-12)
    assert flux_shift_mu(1024) == pytest.approx(0.630, abs=1e-9)
    assert flux_shift_mu(4096) == pytest.approx(1.15, abs=1e-12)
    assert flux_shift_mu(8192) > 1.15
    assert flux_shift_mu(64) < 0.5


def test_mu_kwargs_move_the_end_points() -> None:
    kwargs = {"base_seq_len": 100, "max_seq_len": 300, "base_shift": 0.2, "max_shift": 1.0}
    assert flux_shift_mu(100, **kwargs) == pytest.approx(0.2)
    assert flux_shift_mu(300, **kwargs) == pytest.approx(1.0)
    assert flux_shift_mu(200, **kwargs) == pytest.approx(0.6)


@pytest.mark.parametrize("steps", [1, 4, 28, 50])
@pytest.mark.parametrize("seq_len", [256, 1024, 4096])
def test_shape_dtype_and_end_points(steps: int, seq_len: int) -> None:
    sigmas = flux_sigmas(steps, seq_len)
    assert sigmas.dtype == torch.float32
    assert sigmas.shape == (steps + 1,)
    assert float(sigmas[0]) == 1.0
    assert float(sigmas[-1]) == 0.0
    assert bool((sigmas[1:] < sigmas[:-1]).all())


@pytest.mark.parametrize("steps", [4, 10, 28])
@pytest.mark.parametrize("seq_len", [256, 1024, 4096, 6000])
def test_exponential_shift_is_sd3_shift_with_exp_mu(steps: int, seq_len: int) -> None:
    base = torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float64)
    expected = torch.cat([shift_sigmas(base, math.exp(_linear_mu(seq_len))), torch.zeros(1, dtype=torch.float64)])
    torch.testing.assert_close(flux_sigmas(steps, seq_len), expected.float(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 4, 28, 50])
@pytest.mark.parametrize("seq_len", [256, 1024, 4096, 5000])
def test_matches_diffusers_dynamic_shifting(steps: int, seq_len: int) -> None:
    mu = _linear_mu(seq_len)
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / steps, steps), mu=mu)
    torch.testing.assert_close(flux_sigmas(steps, seq_len), scheduler.sigmas, rtol=0, atol=1e-6)


def test_larger_images_keep_more_noise() -> None:
    small, large = flux_sigmas(20, 1024), flux_sigmas(20, 4096)
    assert bool((large[1:-1] > small[1:-1]).all())


def test_zero_steps_is_rejected() -> None:
    with pytest.raises(ValueError):
        flux_sigmas(0, 1024)


@pytest.mark.parametrize("steps", [1, 4, 28, 50, 200])
def test_flux2_mu_is_the_stock_pipelines_to_the_bit(steps: int) -> None:
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    for tokens in (16, 256, 1024, 4096, 4300, 4301, 16384):
        assert flux2_shift_mu(tokens, steps) == compute_empirical_mu(tokens, steps), tokens


def test_flux2_mu_follows_each_fitted_line_at_its_step_count_and_the_200_step_one_past_4300_tokens() -> None:
    for tokens in (256, 4096):
        assert flux2_shift_mu(tokens, 10) == pytest.approx(8.73809524e-5 * tokens + 1.89833333, abs=1e-12)
        assert flux2_shift_mu(tokens, 200) == pytest.approx(1.6927e-4 * tokens + 0.45666666, abs=1e-12)
    assert flux2_shift_mu(8192, 4) == flux2_shift_mu(8192, 50) == pytest.approx(1.6927e-4 * 8192 + 0.45666666)
