"""Image statistics as metrics: the mean over the samples of each per-image statistic, and the
duplicate rate within a prompt. A hacked reward shows up here as a drift (darker, more saturated,
noisier, collapsed images) while the reward rises."""

from __future__ import annotations

from flowpost.core.evaluation import statistics
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.errors import FlowpostError


def _fraction(value: float, option: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise FlowpostError(f"{option} must be a number in (0, 1], got {value!r}", where=f"options.{option}")
    return float(value)


class Brightness:
    """Mean luma in [0, 1]."""

    name = "brightness"

    def __call__(self, samples: EvalSamples) -> float:
        return float(statistics.brightness(samples.images).mean())


class Saturation:
    """Mean HSV saturation in [0, 1] (0 for grayscale images)."""

    name = "saturation"

    def __call__(self, samples: EvalSamples) -> float:
        return float(statistics.saturation(samples.images).mean())


class DarkFraction:
    """Fraction of pixels whose luma is below ``threshold``."""

    name = "dark_fraction"

    def __init__(self, threshold: float = 0.1) -> None:
        self.threshold = _fraction(threshold, "threshold")

    def __call__(self, samples: EvalSamples) -> float:
        return float(statistics.dark_fraction(samples.images, threshold=self.threshold).mean())


class HighFrequencyEnergy:
    """Share of spectral power above ``cutoff`` cycles per pixel (grid artefacts and noise raise it)."""

    name = "high_frequency"

    def __init__(self, cutoff: float = 0.25) -> None:
        self.cutoff = _fraction(cutoff, "cutoff")

    def __call__(self, samples: EvalSamples) -> float:
        return float(statistics.high_frequency_energy(samples.images, cutoff=self.cutoff).mean())


class DuplicateRate:
    """Fraction of samples within ``threshold`` mean absolute difference of an earlier sample of their prompt."""

    name = "duplicate_rate"
    better = "lower"

    def __init__(self, threshold: float = 0.01) -> None:
        self.threshold = _fraction(threshold, "threshold")

    def __call__(self, samples: EvalSamples) -> float:
        return statistics.duplicate_rate(samples.images, samples.groups(), threshold=self.threshold)
