"""Fréchet distance between two sets of feature vectors (the FID formula)."""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg
from torch import Tensor

from flowpost.errors import FlowpostError

EPS = 1e-6
MAX_CONDITION = 1e12
MAX_IMAGINARY = 1e-3  # pytorch-fid's tolerance on the square root's diagonal
WHERE = "evaluate.metrics"


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

    As pytorch-fid: a (near-)singular ΣaΣb, or one whose square root is not finite, gets ``EPS`` added to
    both diagonals; the imaginary part rounding leaves in the square root is dropped, and one whose
    diagonal exceeds ``MAX_IMAGINARY`` is refused (no Gaussian statistics give it).
    """
    statistics = (mu_a, sigma_a, mu_b, sigma_b)
    if not all(np.isfinite(part).all() for part in statistics):
        raise FlowpostError("the feature statistics are not finite (NaN or inf features)", where=WHERE)
    diff = mu_a - mu_b
    offset = np.eye(sigma_a.shape[0]) * EPS
    product = sigma_a @ sigma_b
    if np.linalg.cond(product) > MAX_CONDITION:
        product = (sigma_a + offset) @ (sigma_b + offset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = scipy.linalg.sqrtm(product)
        if not np.isfinite(covmean).all():
            covmean = scipy.linalg.sqrtm((sigma_a + offset) @ (sigma_b + offset))
    if not np.isfinite(covmean).all():
        raise FlowpostError("the square root of the covariance product is not finite", where=WHERE)
    if np.iscomplexobj(covmean):
        imaginary = float(np.abs(np.diagonal(covmean).imag).max())
        if imaginary > MAX_IMAGINARY:
            raise FlowpostError(
                f"the square root of the covariance product has an imaginary part {imaginary:.3g} on its "
                f"diagonal (above {MAX_IMAGINARY}): a covariance is not positive semi-definite",
                where=WHERE,
            )
        covmean = covmean.real
    value = diff @ diff + np.trace(sigma_a) + np.trace(sigma_b) - 2.0 * np.trace(covmean)
    return float(max(value, 0.0))


def frechet_distance(features_a: Tensor | np.ndarray, features_b: Tensor | np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to features [N, D] and [M, D]."""
    return frechet_from_statistics(*feature_statistics(features_a), *feature_statistics(features_b))
