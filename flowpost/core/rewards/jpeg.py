"""DDPO JPEG rewards: the size of each image encoded as JPEG (quality 95), in kB."""

from __future__ import annotations

import io
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from flowpost.errors import FlowpostError

JPEG_QUALITY = 95


def jpeg_size_kb(media: Tensor) -> Tensor:
    """[B] float32 JPEG file sizes (bytes / 1000) of ``media`` [B, 1 or 3, H, W] in [0, 1]."""
    if media.ndim != 4 or media.shape[1] not in (1, 3):
        raise FlowpostError(
            f"JPEG rewards need grayscale or RGB media [B, 1 or 3, H, W], got {tuple(media.shape)}",
            where="rewards",
        )
    pixels = (media.detach().float() * 255).round().clamp(0, 255).to(torch.uint8)
    sizes = []
    for image in pixels.permute(0, 2, 3, 1).cpu().numpy():
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
            buffer, format="JPEG", quality=JPEG_QUALITY
        )
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32, device=media.device)


class JpegIncompressibility:
    """JPEG size in kB: higher for detailed, noisy images."""

    name = "jpeg_incompressibility"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return jpeg_size_kb(media)


class JpegCompressibility:
    """Negative JPEG size in kB: higher for flat, simple images."""

    name = "jpeg_compressibility"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return -jpeg_size_kb(media)
