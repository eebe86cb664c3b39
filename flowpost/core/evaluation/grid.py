"""Image grids for eyeballing samples (a video: its frames side by side)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from torch import Tensor

from flowpost.core.io import write_bytes_atomic


def frame_strips(videos: Tensor) -> Tensor:
    """Videos [B, C, T, H, W] as images [B, C, H, T * W]: each clip's frames side by side."""
    batch, channels, frames, height, width = videos.shape
    return videos.permute(0, 1, 3, 2, 4).reshape(batch, channels, height, frames * width)


def make_grid(images: Tensor, *, nrow: int, scale: int = 4, padding: int = 1) -> Image.Image:
    """Tile [B, C, H, W] images in [0, 1] into ``nrow`` per row, upscaled by ``scale``; videos
    [B, C, T, H, W] tile as their ``frame_strips``.

    Upscaling is nearest-neighbour; ``padding`` black pixels (after scaling) separate and
    surround the tiles. C=1 gives an "L" image, C=3 an "RGB" one.
    """
    if images.ndim == 5:
        images = frame_strips(images)
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be [B, 1 or 3, H, W] or videos [B, 1 or 3, T, H, W], got {tuple(images.shape)}")
    if nrow < 1 or scale < 1 or padding < 0:
        raise ValueError("nrow and scale must be >= 1 and padding >= 0")
    count, channels, height, width = images.shape
    pixels = (images.detach().float().clamp(0, 1) * 255).round().byte().cpu().numpy()
    pixels = pixels.repeat(scale, axis=2).repeat(scale, axis=3).transpose(0, 2, 3, 1)
    rows = -(-count // nrow)
    cols = min(nrow, count)
    tile_h, tile_w = height * scale, width * scale
    canvas = np.zeros(
        (rows * (tile_h + padding) + padding, cols * (tile_w + padding) + padding, channels),
        dtype=np.uint8,
    )
    for index in range(count):
        top = padding + (index // nrow) * (tile_h + padding)
        left = padding + (index % nrow) * (tile_w + padding)
        canvas[top : top + tile_h, left : left + tile_w] = pixels[index]
    if channels == 1:
        return Image.fromarray(canvas[:, :, 0])
    return Image.fromarray(canvas)


def save_grid(images: Tensor, path: str | Path, *, nrow: int, scale: int = 4) -> None:
    """Write :func:`make_grid` of ``images`` to ``path`` as a PNG, atomically."""
    buffer = io.BytesIO()
    make_grid(images, nrow=nrow, scale=scale).save(buffer, format="PNG")
    write_bytes_atomic(path, buffer.getvalue())
