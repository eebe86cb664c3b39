"""The mean of a metric over evaluation seeds and its 95 % confidence interval."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class SeedSummary:
    """``mean`` over ``n`` seeds and the Student-t interval ``[low, high]`` around it (the mean alone for one)."""

    mean: float
    low: float
    high: float
    n: int


def summarize(values: list[float]) -> SeedSummary:
    """mean ± t(0.975, n-1) · s / sqrt(n), with s the sample standard deviation of ``values``."""
    if not values:
        raise ValueError("no values to summarize")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return SeedSummary(mean, mean, mean, 1)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * spread / math.sqrt(n)
    return SeedSummary(mean, mean - half, mean + half, n)
