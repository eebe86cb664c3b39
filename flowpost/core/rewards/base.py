"""The reward protocol."""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class Reward(Protocol):
    """Scores a batch: ``media`` [B, C, H, W] in [0, 1], one prompt and metadata dict per sample; a reward
    entry with ``frames: clip`` gets videos [B, C, T, H, W] (``FrameSelection``)."""

    name: str

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor: ...
