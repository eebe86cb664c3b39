"""Decode, convert, resize and crop one source image into a training image, deterministically."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image

from flowpost.core.config.schema import PreprocessConfig
from flowpost.data.sources.items import BadItem

PIL_MODES = {"grayscale": "L", "rgb": "RGB"}


def training_image(source: Path | bytes, config: PreprocessConfig, *, name: str) -> np.ndarray:
    """float32 [C, H, W] in [0, 1] at ``config.resolution``; a BadItem when it cannot be read or converted.

    The short side is resized to the resolution, then the square is cropped at the centre or, with
    ``crop: random``, at an offset drawn from ``(config.seed, name)``: the same on every run.
    """
    image = _decoded(source)
    try:
        image = image.convert(PIL_MODES[config.mode])
    except ValueError as exc:
        raise BadItem("unconvertible_mode", f"mode {image.mode} cannot become {config.mode} ({exc})") from None
    side = config.resolution
    scale = side / min(image.size)
    size = (max(side, round(image.width * scale)), max(side, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.BICUBIC)
    left, top = _offset(image.width - side, config, name, 0), _offset(image.height - side, config, name, 1)
    array = np.asarray(image.crop((left, top, left + side, top + side)), dtype=np.float32) / 255.0
    return np.ascontiguousarray(array.reshape(side, side, -1).transpose(2, 0, 1))


def _decoded(source: Path | bytes) -> Image.Image:
    """The fully decoded image: a missing, foreign or truncated file is a BadItem, never a partial image."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image.load()
            return image.copy()
    except FileNotFoundError:
        raise BadItem("unreadable_image", "the image file does not exist") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise BadItem("unreadable_image", f"not a readable image ({exc})") from None


def _offset(slack: int, config: PreprocessConfig, name: str, axis: int) -> int:
    if slack <= 0:
        return 0
    if config.crop == "center":
        return slack // 2
    digest = hashlib.sha256(f"{config.seed}\0{name}\0{axis}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (slack + 1)
