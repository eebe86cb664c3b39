"""Image statistics the reward and the metric share."""

from __future__ import annotations

import torch
from torch import Tensor

LUMA = (0.299, 0.587, 0.114)  # BT.601 weights of R, G, B


def luma(images: Tensor) -> Tensor:
    """The luma [N, H, W] of grayscale or RGB images [N, 1 or 3, H, W] in [0, 1]."""
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"need grayscale or RGB images [N, 1 or 3, H, W], got {tuple(images.shape)}")
    if images.shape[1] == 1:
        return images[:, 0].float()
    weights = torch.tensor(LUMA, dtype=torch.float32, device=images.device)
    return torch.einsum("nchw,c->nhw", images.float(), weights)
