from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flowpost.core.evaluation.grid import make_grid, save_grid


def test_grayscale_grid_size_and_pixels() -> None:
    images = torch.zeros(5, 1, 2, 3)
    images[0] = 1.0
    images[4, 0, 1, 2] = 0.5
    grid = make_grid(images, nrow=3, scale=2, padding=1)
    assert grid.mode == "L"
    assert grid.size == (3 * (3 * 2 + 1) + 1, 2 * (2 * 2 + 1) + 1)
    pixels = np.asarray(grid)
    assert (pixels[1:5, 1:7] == 255).all()
    assert (pixels[0, :] == 0).all() and (pixels[:, 7] == 0).all()
    # image 4 is row 1, column 1; its pixel (1, 2) maps to a 2x2 block
    top, left = 1 + 5 + 2, 1 + 7 + 4
    assert (pixels[top : top + 2, left : left + 2] == 128).all()
    assert pixels.sum() == 4 * 6 * 255 + 4 * 128


def test_rgb_grid_clamps() -> None:
    images = torch.full((2, 3, 4, 4), 2.0)
    images[:, 1] = -1.0
    grid = make_grid(images, nrow=2, scale=1, padding=0)
    assert grid.mode == "RGB"
    assert grid.size == (8, 4)
    assert np.asarray(grid)[0, 0].tolist() == [255, 0, 255]


def test_rejects_bad_channel_count() -> None:
    with pytest.raises(ValueError, match="1 or 3"):
        make_grid(torch.zeros(2, 2, 4, 4), nrow=2)


def test_save_grid_writes_png(tmp_path: Path) -> None:
    path = tmp_path / "out" / "grid.png"
    save_grid(torch.rand(4, 1, 16, 16), path, nrow=2)
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (2 * 65 + 1, 2 * 65 + 1)
    assert list(path.parent.iterdir()) == [path]
