"""Fréchet distance between two sets of feature vectors (the FID formula)."""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg
from torch import Tensor

EPS = 1e-6
MAX_CONDITION = 1e12


def _as_float64(features: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(features, Tensor):
        features = features.detach().cpu().numpy()
    array = np.asarray(features, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 2:
        raise ValueError(f"features must be [N >= 2, D], got shape {array.shape}")
    return array


def feature_statistics(features: Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean [D] and unbiased covariance [D, D] of features [N, D], in float64."""
    array = _as_float64(features)
    return array.mean(axis=0), np.atleast_2d(np.cov(array, rowvar=False))


def frechet_from_statistics(mu_a: np.ndarray, sigma_a: np.ndarray, mu_b: np.ndarray, sigma_b: np.ndarray) -> float:
    """||mu_a - mu_b||² + Tr(Σa + Σb − 2(ΣaΣb)^½) for two Gaussians.

    A (near-)singular ΣaΣb gets ``EPS`` added to both diagonals first; the imaginary part that
    rounding leaves in the matrix square root is dropped.
    """
    diff = mu_a - mu_b
    product = sigma_a @ sigma_b
    if np.linalg.cond(product) > MAX_CONDITION:
        offset = np.eye(sigma_a.shape[0]) * EPS
        product = (sigma_a + offset) @ (sigma_b + offset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = np.real(scipy.linalg.sqrtm(product))
    value = diff @ diff + np.trace(sigma_a) + np.trace(sigma_b) - 2.0 * np.trace(covmean)
    return float(max(value, 0.0))


def frechet_distance(features_a: Tensor | np.ndarray, features_b: Tensor | np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to features [N, D] and [M, D]."""
    return frechet_from_statistics(*feature_statistics(features_a), *feature_statistics(features_b))
