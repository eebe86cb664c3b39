"""Square model inputs from generated images, in torch: torchvision's ``Resize(size, BICUBIC)``,
``CenterCrop(size)`` and ``Normalize(mean, std)``, the evaluation transform of HPS v2 and ImageReward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from flowpost.errors import FlowpostError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def square_inputs(media: Tensor, size: int, *, mean: Sequence[float], std: Sequence[float], reward: str) -> Tensor:
    """[B, 3, size, size] float32 from ``media`` [B, 1 or 3, H, W] in [0, 1] (grayscale repeated to RGB).

    The shorter side is resized to ``size`` (bicubic, antialiased, aspect kept), the centre cropped to a
    square and each channel normalised; ``reward`` names the caller in the error for other shapes.
    """
    if media.ndim != 4 or media.shape[1] not in (1, 3):
        raise FlowpostError(
            f"{reward} needs grayscale or RGB media [B, 1 or 3, H, W], got {tuple(media.shape)}", where="rewards"
        )
    images = media.detach().float().clamp(0, 1).expand(-1, 3, -1, -1)
    height, width = images.shape[-2:]
    short, long = sorted((height, width))
    scaled = (size, int(size * long / short))
    images = F.interpolate(images, size=scaled if height <= width else scaled[::-1], mode="bicubic", antialias=True)
    top, left = (round((side - size) / 2) for side in images.shape[-2:])  # torchvision's CenterCrop offsets
    images = images[..., top : top + size, left : left + size].clamp(0, 1)
    shift = torch.tensor(mean, device=images.device).view(1, 3, 1, 1)
    scale = torch.tensor(std, device=images.device).view(1, 3, 1, 1)
    return (images - shift) / scale
