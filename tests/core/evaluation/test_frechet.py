from __future__ import annotations

import numpy as np
import pytest
import torch

from flowpost.core.evaluation.frechet import (
    feature_statistics,
    frechet_distance,
    frechet_from_statistics,
)
from flowpost.errors import FlowpostError


def gaussian(n: int, mean: np.ndarray, std: np.ndarray, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, len(mean))) * std + mean


def closed_form(mu_a, std_a, mu_b, std_b) -> float:
    """Fréchet distance of two Gaussians with diagonal covariances."""
    return float(np.sum((mu_a - mu_b) ** 2) + np.sum((std_a - std_b) ** 2))


def test_statistics_shapes_and_values() -> None:
    features = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]])
    mu, sigma = feature_statistics(features)
    assert mu.dtype == np.float64 and sigma.shape == (2, 2)
    np.testing.assert_allclose(mu, [2.0, 4.0])
    np.testing.assert_allclose(sigma, np.cov(features.numpy().astype(np.float64), rowvar=False))


def test_identical_sets_are_zero() -> None:
    features = gaussian(200, np.zeros(8), np.ones(8), seed=0)
    assert frechet_distance(features, features) == pytest.approx(0.0, abs=1e-6)
    assert frechet_distance(torch.from_numpy(features).float(), features) == pytest.approx(0.0, abs=1e-4)


def test_matches_closed_form_on_explicit_statistics() -> None:
    mu_a, std_a = np.array([0.0, 1.0, -2.0]), np.array([1.0, 2.0, 0.5])
    mu_b, std_b = np.array([1.0, 1.0, 0.0]), np.array([3.0, 1.0, 0.5])
    value = frechet_from_statistics(mu_a, np.diag(std_a**2), mu_b, np.diag(std_b**2))
    assert value == pytest.approx(closed_form(mu_a, std_a, mu_b, std_b), rel=1e-9)


def test_matches_closed_form_on_samples() -> None:
    mu_a, std_a = np.zeros(4), np.array([1.0, 0.5, 2.0, 1.0])
    mu_b, std_b = np.full(4, 0.5), np.array([1.5, 0.5, 1.0, 1.0])
    value = frechet_distance(gaussian(40_000, mu_a, std_a, seed=1), gaussian(40_000, mu_b, std_b, seed=2))
    assert value == pytest.approx(closed_form(mu_a, std_a, mu_b, std_b), rel=0.03)


def test_symmetric_and_grows_with_mean_shift() -> None:
    a = gaussian(500, np.zeros(6), np.ones(6), seed=3)
    b = gaussian(500, np.zeros(6), np.ones(6), seed=4)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-6)
    distances = [frechet_distance(a, b + shift) for shift in (0.0, 0.5, 1.0, 2.0)]
    assert distances == sorted(distances)
    assert distances[-1] > 10 * distances[0]


def test_singular_covariances_give_finite_symmetric_value() -> None:
    a = np.maximum(gaussian(30, np.zeros(64), np.ones(64), seed=5), 0.0)
    a[:, :5] = 0.0
    b = np.maximum(gaussian(40, np.zeros(64), np.ones(64), seed=6), 0.0)
    forward, backward = frechet_distance(a, b), frechet_distance(b, a)
    assert np.isfinite(forward) and forward > 0
    assert forward == pytest.approx(backward, rel=1e-6)


def test_rejects_too_few_rows() -> None:
    with pytest.raises(ValueError, match="N >= 2"):
        frechet_distance(np.zeros((1, 3)), np.zeros((5, 3)))


def test_a_significant_imaginary_square_root_is_refused() -> None:
    """An indefinite covariance (corrupted statistics) makes the square root complex: refused, not dropped."""
    mu = np.zeros(2)
    with pytest.raises(FlowpostError, match="imaginary part 1"):
        frechet_from_statistics(mu, np.diag([1.0, -1.0]), mu, np.eye(2))


def test_rounding_noise_in_the_imaginary_part_is_dropped() -> None:
    a = np.maximum(gaussian(30, np.zeros(64), np.ones(64), seed=5), 0.0)
    b = np.maximum(gaussian(40, np.zeros(64), np.ones(64), seed=6), 0.0)
    assert np.isfinite(frechet_distance(a, b))


def test_non_finite_statistics_are_refused() -> None:
    mu, sigma = np.zeros(2), np.eye(2)
    with pytest.raises(FlowpostError, match="not finite"):
        frechet_from_statistics(mu, np.array([[1.0, np.nan], [np.nan, 1.0]]), mu, sigma)
