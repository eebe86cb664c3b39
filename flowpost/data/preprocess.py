"""Decode, convert, resize and crop one source image into a training image, deterministically.

Decoding does what a person looking at the file sees: the EXIF orientation is applied, 16-bit
grayscale is scaled to 8 bits (not clipped), transparent pixels are composited on
``preprocess.background``, and an image over ``preprocess.max_megapixels`` is skipped before its
pixels are read (``DECODING`` is what acquisition records in its manifest).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from flowpost.core.config.schema.media import PreprocessConfig
from flowpost.data.sources.items import BadItem

PIL_MODES = {"grayscale": "L", "rgb": "RGB"}
NPY_MAGIC = b"\x93NUMPY"


def training_image(source: Path | bytes, config: PreprocessConfig, *, name: str) -> np.ndarray:
    """float32 [C, H, W] in [0, 1] at ``config.resolution``; a BadItem when it cannot be read or converted."""
    return prepared_image(_decoded(source, config), config, name=name)


def decoding_record(config: PreprocessConfig) -> dict[str, Any]:
    """How images were decoded, for the dataset's manifest."""
    return {
        "exif_orientation": "applied",
        "sixteen_bit": "scaled to 8 bits",
        "alpha": f"composited on {config.background}",
        "max_megapixels": config.max_megapixels,
    }


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


def _decoded(source: Path | bytes, config: PreprocessConfig) -> Image.Image:
    """The fully decoded image, upright, 8-bit and opaque: a missing, foreign, truncated or oversized file is
    a BadItem, never a partial image."""
    if isinstance(source, bytes) and source.startswith(NPY_MAGIC):
        return _opaque(_array_image(source), config.background)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked below
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
                _check_size(image.width, image.height, config)
                image.load()
                upright = ImageOps.exif_transpose(image)
    except FileNotFoundError:
        raise BadItem("unreadable_image", "the image file does not exist") from None
    except Image.DecompressionBombError as exc:
        raise BadItem("oversized_image", f"{exc}; preprocess.max_megapixels is {config.max_megapixels:g}") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise BadItem("unreadable_image", f"not a readable image ({exc})") from None
    return _opaque(_eight_bit(upright), config.background)


def _check_size(width: int, height: int, config: PreprocessConfig) -> None:
    megapixels = width * height / 1e6
    if megapixels > config.max_megapixels:
        raise BadItem(
            "oversized_image",
            f"{width}x{height} is {megapixels:.1f} megapixels, more than preprocess.max_megapixels "
            f"{config.max_megapixels:g}; downscale it or raise the limit",
        )


def _eight_bit(image: Image.Image) -> Image.Image:
    """16- and 32-bit integer grayscale scaled to 8 bits (PIL's ``convert`` would clip it at 255)."""
    if image.mode.startswith("I;16") or (image.mode == "I" and image.getextrema()[1] > 255):
        array = np.asarray(image, dtype=np.float64) / 257.0
        return Image.fromarray(np.clip(array + 0.5, 0, 255).astype(np.uint8), mode="L")
    return image


def _opaque(image: Image.Image, background: str) -> Image.Image:
    """Transparent pixels composited on ``background`` (an image without alpha is returned as it is)."""
    if image.mode not in ("RGBA", "LA", "PA", "RGBa", "La") and "transparency" not in image.info:
        return image
    rgba = image.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, background), rgba).convert("RGB")


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
