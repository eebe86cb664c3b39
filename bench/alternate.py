"""Measure two arms in one run, alternating their order round by round, and summarise by medians.

The machine's speed drifts within minutes; running flowpost and its baseline back to back, the
order swapped every round, lets the drift fall on both arms alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

Arm = Callable[[], list[float]]  # one round of an arm: the seconds of each timed unit


@dataclass
class Comparison:
    """Per-unit seconds of ``subject`` (flowpost) and ``baseline``, pooled over alternating rounds."""

    subject: str
    baseline: str
    unit: str
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def median(self, arm: str) -> float:
        return statistics.median(self.seconds[arm])

    @property
    def ratio(self) -> float:
        """Median seconds of the subject per median seconds of the baseline (1.0: no overhead)."""
        return self.median(self.subject) / self.median(self.baseline)

    def line(self, items_per_unit: int | None = None) -> str:
        parts = []
        for arm in (self.subject, self.baseline):
            text = f"{arm} {1000 * self.median(arm):.1f} ms/{self.unit} (n={len(self.seconds[arm])})"
            if items_per_unit:
                text += f", {items_per_unit / self.median(arm):.1f} items/s"
            parts.append(text)
        return "; ".join(parts) + f"; ratio {self.ratio:.3f}"

    def summary(self) -> dict[str, float | int | str]:
        return {
            "unit": self.unit,
            f"{self.subject}_median_s": self.median(self.subject),
            f"{self.baseline}_median_s": self.median(self.baseline),
            "ratio": self.ratio,
            "units": min(len(values) for values in self.seconds.values()),
        }


def alternate(subject: tuple[str, Arm], baseline: tuple[str, Arm], *, rounds: int, unit: str) -> Comparison:
    """Run both arms ``rounds`` times each, subject first in even rounds and baseline first in odd ones."""
    comparison = Comparison(subject=subject[0], baseline=baseline[0], unit=unit)
    comparison.seconds = {subject[0]: [], baseline[0]: []}
    for number in range(rounds):
        for name, arm in (subject, baseline) if number % 2 == 0 else (baseline, subject):
            comparison.seconds[name] += arm()
    return comparison
