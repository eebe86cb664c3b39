"""``source: builtin-digits``: the fields of the digits dataset."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from flowpost.core.config.schema.dataset_base import StoredDataset

# judge adherence (the headline), the trained reward, the judge's Fréchet distance
DIGITS_METRICS: tuple[str | dict[str, Any], ...] = (
    "adherence",
    {"name": "digit_adherence", "key": "reward_mean"},
    "fd",
)


class DigitsDataset(StoredDataset):
    """The digits (scikit-learn's 8x8), upscaled to ``image_size``, with the digit classifiers."""

    WRITES_ASSETS = True  # assets/: the reward and judge classifiers
    DEFAULT_METRICS: ClassVar[tuple[str | dict[str, Any], ...]] = DIGITS_METRICS

    source: Literal["builtin-digits"] = "builtin-digits"
    image_size: int = Field(16, ge=8, le=64, multiple_of=4)
    test_fraction: float = Field(0.2, gt=0, lt=1)

    def image_channels(self) -> int:
        """Grayscale: 1."""
        return 1

    def holds_out(self) -> bool:
        """Its test split's images, under held-out templates."""
        return True
