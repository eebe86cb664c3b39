"""Preprocessing: resize the short side, crop at the centre or at an offset addressed by seed and item."""

from __future__ import annotations

import numpy as np
import pytest
from image_samples import png_bytes
from PIL import Image

from flowpost.core.config.schema import ImageFolderDataset, PreprocessConfig
from flowpost.data.preprocess import training_image
from flowpost_digits.config import DigitsDataset


def _gradient() -> bytes:
    import io

    buffer = io.BytesIO()
    Image.fromarray(np.tile(np.arange(64, dtype=np.uint8) * 4, (16, 1))).save(buffer, format="PNG")
    return buffer.getvalue()


def test_random_crops_are_addressed_by_seed_and_item() -> None:
    config = PreprocessConfig(resolution=8, crop="random", mode="grayscale")
    crops = {name: training_image(_gradient(), config, name=name) for name in ("a", "b", "c", "d")}
    assert all(np.array_equal(training_image(_gradient(), config, name=n), crop) for n, crop in crops.items())
    assert len({crop.tobytes() for crop in crops.values()}) > 1
    other = PreprocessConfig(resolution=8, crop="random", mode="grayscale", seed=1)
    assert any(not np.array_equal(training_image(_gradient(), other, name=n), c) for n, c in crops.items())


def test_center_crop_and_channels_follow_the_mode() -> None:
    centre = training_image(_gradient(), PreprocessConfig(resolution=8, mode="grayscale"), name="x")
    assert centre.shape == (1, 8, 8) and 0.4 < centre.mean() < 0.6  # the middle of the ramp
    assert training_image(png_bytes(mode="L"), PreprocessConfig(mode="rgb"), name="x").shape == (3, 16, 16)


def test_each_source_refuses_the_other_sources_fields() -> None:
    with pytest.raises(ValueError, match="image_size do not apply to source 'image-folder'"):
        ImageFolderDataset(path="x", image_size=16)
    with pytest.raises(ValueError, match="preprocess do not apply to source 'builtin-digits'"):
        DigitsDataset(preprocess={"resolution": 8})
    with pytest.raises(ValueError, match="image_column do not apply"):
        ImageFolderDataset(path="x", image_column="img")
