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
NPY_MAGIC = b"\x93NUMPY"


def training_image(source: Path | bytes, config: PreprocessConfig, *, name: str) -> np.ndarray:
    """float32 [C, H, W] in [0, 1] at ``config.resolution``; a BadItem when it cannot be read or converted."""
    return prepared_image(_decoded(source), config, name=name)


def prepared_image(image: Image.Image, config: PreprocessConfig, *, name: str) -> np.ndarray:
    """float32 [C, H, W] in [0, 1]: ``image`` converted to ``config.mode``, its short side resized to the
    resolution, then the square cropped at the centre or, with ``crop: random``, at an offset drawn from
    ``(config.seed, name)``: the same on every run (and for every frame of one clip)."""
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
    if isinstance(source, bytes) and source.startswith(NPY_MAGIC):
        return _array_image(source)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            image.load()
            return image.copy()
    except FileNotFoundError:
        raise BadItem("unreadable_image", "the image file does not exist") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise BadItem("unreadable_image", f"not a readable image ({exc})") from None


def _array_image(data: bytes) -> Image.Image:
    """A ``.npy`` array as an image (never unpickled): uint8 or [0, 1] floats, [H, W] or [H, W, 1 | 3 | 4]."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BadItem("unreadable_image", f"not a readable .npy array ({exc})") from None
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))) or min(array.shape[:2]) < 1:
        raise BadItem("unconvertible_mode", f"an array of shape {list(array.shape)} is not [H, W] or [H, W, 1|3|4]")
    if array.dtype.kind == "f":
        array = np.clip(np.nan_to_num(array), 0.0, 1.0) * 255.0 + 0.5
    elif array.dtype != np.uint8:
        raise BadItem("unconvertible_mode", f"an array of dtype {array.dtype} is neither uint8 nor float")
    return Image.fromarray(array.astype(np.uint8))


def _offset(slack: int, config: PreprocessConfig, name: str, axis: int) -> int:
    if slack <= 0:
        return 0
    if config.crop == "center":
        return slack // 2
    digest = hashlib.sha256(f"{config.seed}\0{name}\0{axis}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (slack + 1)
