"""A guard's verdicts: a judge's drop in its good direction, bands absolute and relative to the start."""

from __future__ import annotations

import pytest

from flowpost.core.evaluation.guard import Band, Judge
from flowpost.core.evaluation.image_metrics import Brightness


@pytest.mark.parametrize(
    ("better", "start", "value", "violated"),
    [
        ("higher", 0.80, 0.71, False),
        ("higher", 0.80, 0.69, True),
        ("higher", 0.80, 0.95, False),
        ("lower", 50.0, 55.0, False),
        ("lower", 50.0, 65.0, True),
        ("lower", 50.0, 10.0, False),
    ],
)
def test_a_judge_is_violated_by_a_drop_beyond_max_drop(better: str, start: float, value: float, violated: bool) -> None:
    max_drop = 0.1 if better == "higher" else 10.0
    judge = Judge(key="m", metric=Brightness(), max_drop=max_drop, better=better)  # type: ignore[arg-type]
    why = judge.violation(value, start)
    assert (why is not None) == violated
    if why is not None:
        assert f"worse than its start {start:.4g}" in why


@pytest.mark.parametrize(
    ("band", "value", "problem"),
    [
        (Band(min=0.2), 0.1, "below its min 0.2"),
        (Band(max=0.5), 0.6, "above its max 0.5"),
        (Band(max_change=0.1), 0.45, "from its start 0.3 (max_change 0.1)"),
        (Band(max_change=0.1), 0.15, "from its start 0.3 (max_change 0.1)"),
        (Band(min=0.2, max=0.5, max_change=0.2), 0.4, None),
    ],
)
def test_a_band_names_the_edge_a_value_crossed(band: Band, value: float, problem: str | None) -> None:
    why = band.violation(value, 0.3)
    assert why == problem if problem is None else problem in why
