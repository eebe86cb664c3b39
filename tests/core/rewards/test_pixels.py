"""Square model inputs in torch against PIL's bicubic resize and torchvision's centre-crop offsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

from flowpost.core.rewards.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, square_inputs
from flowpost.errors import FlowpostError

MEAN = torch.tensor(OPENAI_CLIP_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(OPENAI_CLIP_STD).view(1, 3, 1, 1)


def _pil_inputs(media: torch.Tensor, size: int) -> torch.Tensor:
    """ImageReward's PIL path: Resize(size, BICUBIC) on the shorter side, CenterCrop(size), to [0, 1]."""
    images = []
    for image in media.expand(-1, 3, -1, -1):
        pil = Image.fromarray((image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())
        width, height = pil.size
        scale = size / min(width, height)
        pil = pil.resize((max(size, int(width * scale)), max(size, int(height * scale))), Image.BICUBIC)
        left, top = round((pil.size[0] - size) / 2), round((pil.size[1] - size) / 2)
        pil = pil.crop((left, top, left + size, top + size))
        images.append(torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255).permute(2, 0, 1))
    return torch.stack(images)


@pytest.mark.parametrize("shape", [(2, 3, 40, 64), (2, 1, 64, 41), (1, 3, 16, 16), (1, 3, 32, 32)])
def test_inputs_follow_the_reference_transform(shape: tuple[int, ...]) -> None:
    coarse = torch.rand(shape[0], shape[1], 5, 4, generator=torch.Generator().manual_seed(0))
    media = (F.interpolate(coarse, size=shape[2:], mode="bilinear") * 255).round() / 255
    ours = square_inputs(media, 32, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, reward="test")
    assert ours.shape == (shape[0], 3, 32, 32) and ours.dtype == torch.float32
    error = (ours * STD + MEAN - _pil_inputs(media, 32)) * 255
    assert error.abs().mean() < 0.5 and error.abs().max() < 2  # a crop one pixel off: mean 5


def test_an_image_of_the_size_is_only_normalised() -> None:
    media = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ours = square_inputs(media, 32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), reward="test")
    torch.testing.assert_close(ours, (media - 0.5) / 0.25)


def test_other_shapes_are_refused() -> None:
    with pytest.raises(FlowpostError, match="hpsv2 needs grayscale or RGB media"):
        square_inputs(torch.zeros(1, 4, 8, 8), 8, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, reward="hpsv2")
