"""Mean brightness as a reward: deliberately easy to hack (a brighter image scores higher whatever it
shows), for studying and guarding against reward hacking."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from flowpost.core.evaluation.statistics import brightness
from flowpost.errors import FlowpostError


class BrightnessReward:
    """The mean luma of each image in [0, 1] (BT.601 weights for RGB): the reward form of the
    ``brightness`` metric."""

    name = "mean_brightness"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if media.ndim != 4 or media.shape[1] not in (1, 3):
            raise FlowpostError(
                f"the mean_brightness reward needs grayscale or RGB images [B, 1 or 3, H, W], got {tuple(media.shape)}",
                where="rewards",
            )
        return brightness(media)
