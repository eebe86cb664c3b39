"""The ``contrast`` reward: the RMS contrast of each image."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from flowpost.errors import FlowpostError
from flowpost_example_plugin.images import luma


class Contrast:
    """The standard deviation of each image's luma, in [0, 0.5]; with ``target``, minus its distance to it (a
    contrast to reach rather than to maximise)."""

    name = "contrast"

    def __init__(self, target: float | None = None) -> None:
        if target is not None and not 0 <= target <= 0.5:
            raise FlowpostError(f"{target} is outside [0, 0.5], the range of RMS contrast", where="options.target")
        self.target = target

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        contrast = luma(media).flatten(1).std(dim=1, unbiased=False)
        return contrast if self.target is None else -(contrast - self.target).abs()
