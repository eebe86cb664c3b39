"""Typed records that acquisition writes and loaders read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PromptRecord:
    """A prompt with free-form metadata."""

    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Demonstration:
    """A prompt and its target image, float32 [C, H, W], or clip, float32 [C, T, H, W], with values in [0, 1].

    Compared by identity: the image is an array.
    """

    key: str
    prompt: str
    image: np.ndarray
    label: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.key or "." in self.key:
            raise ValueError(f"record key {self.key!r} must be non-empty and contain no dots")
        if self.image.dtype != np.float32 or self.image.ndim not in (3, 4):
            raise ValueError(
                f"record {self.key!r}: image must be float32 [C, H, W] or [C, T, H, W], "
                f"got {self.image.dtype} with shape {tuple(self.image.shape)}"
            )
