"""Means over seeds and their 95 % Student-t intervals."""

from __future__ import annotations

import math

import pytest

from flowpost.core.evaluation.intervals import summarize

T_975 = {1: 12.706204736, 2: 4.302652730, 4: 2.776445105}  # t(0.975, df) from a printed table


@pytest.mark.parametrize("values", [[0.2, 0.4], [1.0, 2.0, 6.0], [3.0, 3.5, 2.5, 4.0, 3.1]])
def test_the_interval_is_mean_plus_minus_t_times_the_standard_error(values: list[float]) -> None:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T_975[n - 1] * std / math.sqrt(n)
    summary = summarize(values)
    assert summary.n == n and summary.mean == pytest.approx(mean)
    assert (summary.low, summary.high) == pytest.approx((mean - half, mean + half), rel=1e-8)


def test_one_seed_is_its_own_mean_with_no_spread() -> None:
    summary = summarize([0.777999997138977])
    assert summary.mean == summary.low == summary.high == 0.777999997138977  # bit for bit: the single value


def test_equal_values_have_a_zero_width_interval_and_no_values_are_an_error() -> None:
    assert summarize([0.5, 0.5, 0.5]).low == summarize([0.5, 0.5, 0.5]).high == 0.5
    with pytest.raises(ValueError, match="no values"):
        summarize([])
