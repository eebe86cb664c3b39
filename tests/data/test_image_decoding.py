"""Source images decode as a person sees them: upright, 16-bit scaled, transparency composited, size-checked."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flowpost.core.config.schema import PreprocessConfig
from flowpost.data.preprocess import training_image
from flowpost.data.sources.items import BadItem

RGB = PreprocessConfig(resolution=8, mode="rgb")


def _png(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


def test_the_exif_orientation_is_applied(tmp_path: Path) -> None:
    pixels = np.zeros((8, 16, 3), dtype=np.uint8)  # 16 wide, 8 tall: black left half, white right half
    pixels[:, 8:] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was turned: show the stored image rotated 90 degrees clockwise
    file = tmp_path / "photo.png"
    file.write_bytes(_png(Image.fromarray(pixels), exif=exif.tobytes()))
    image = training_image(file, PreprocessConfig(resolution=8, mode="grayscale"), name="photo")[0]
    # upright, the photo is 8 wide and 16 tall, its stored left (black) half on top; stored as it is, the
    # centre crop would hold a black left and a white right half instead
    assert image.shape == (8, 8)
    assert image[:4].mean() < 0.1 and image[4:].mean() > 0.9


def test_16_bit_grayscale_is_scaled_not_saturated() -> None:
    grey = Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16))
    assert grey.mode.startswith("I")
    image = training_image(_png(grey), PreprocessConfig(resolution=8, mode="grayscale"), name="grey")
    assert image == pytest.approx(np.full((1, 8, 8), 0.5), abs=1 / 255)


@pytest.mark.parametrize(("background", "value"), [("white", 1.0), ("black", 0.0)])
def test_transparent_pixels_show_the_stated_background(background: str, value: float) -> None:
    hidden_red = np.zeros((8, 8, 4), dtype=np.uint8)
    hidden_red[..., 0] = 255  # fully transparent red: PIL's convert would train on the red
    config = PreprocessConfig(resolution=8, mode="rgb", background=background)
    image = training_image(_png(Image.fromarray(hidden_red, mode="RGBA")), config, name="clear")
    assert image == pytest.approx(np.full((3, 8, 8), value))


def test_half_transparent_pixels_blend_with_the_background() -> None:
    pixels = np.zeros((8, 8, 4), dtype=np.uint8)
    pixels[..., 3] = 128  # half-covered black on white
    image = training_image(_png(Image.fromarray(pixels, mode="RGBA")), RGB, name="half")
    assert image == pytest.approx(np.full((3, 8, 8), 127 / 255), abs=1 / 255)


def test_an_image_over_the_pixel_limit_is_a_bad_item_before_it_is_decoded() -> None:
    config = PreprocessConfig(resolution=8, mode="rgb", max_megapixels=0.001)
    with pytest.raises(BadItem) as bad:
        training_image(_png(Image.new("RGB", (40, 40))), config, name="big")
    assert bad.value.kind == "oversized_image"
    assert "40x40 is 0.0 megapixels, more than preprocess.max_megapixels 0.001" in str(bad.value)
