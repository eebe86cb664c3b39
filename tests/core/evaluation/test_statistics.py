"""Image statistics and their metrics, against computations written out pixel by pixel."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
from PIL import Image

from flowpost.core.evaluation import statistics
from flowpost.core.evaluation.image_metrics import (
    Brightness,
    DarkFraction,
    DuplicateRate,
    HighFrequencyEnergy,
    Saturation,
)
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.errors import FlowpostError


def _images(n: int, channels: int, size: int = 8, seed: int = 0) -> torch.Tensor:
    """Random images whose values are exact multiples of 1/255 (what PIL sees is what torch sees)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, size, size), generator=generator).float() / 255


def _samples(images: torch.Tensor, prompts: list[str] | None = None) -> EvalSamples:
    prompts = prompts or ["p"] * images.shape[0]
    return EvalSamples(images=images, prompts=prompts, metadata=[{} for _ in prompts])


def test_brightness_is_the_mean_of_pils_luma() -> None:
    images = _images(4, 3)
    pixels = (images * 255).round().byte().permute(0, 2, 3, 1).numpy()
    expected = np.mean([np.asarray(Image.fromarray(p).convert("L"), dtype=np.float64).mean() / 255 for p in pixels])
    assert Brightness()(_samples(images)) == pytest.approx(expected, abs=1 / 255)  # PIL rounds each pixel
    grey = _images(3, 1)
    assert Brightness()(_samples(grey)) == pytest.approx(float(grey.double().mean()), rel=1e-6)


def test_saturation_is_the_mean_hsv_saturation_of_colorsys() -> None:
    images = _images(3, 3, size=5)
    images[0, :, 0, 0] = 0.0  # a black pixel: saturation 0
    images[1, :, 1, 1] = 0.5  # a grey pixel: saturation 0
    expected = np.mean(
        [
            colorsys.rgb_to_hsv(*(float(c) for c in images[n, :, y, x]))[1]
            for n in range(3)
            for y in range(5)
            for x in range(5)
        ]
    )
    assert Saturation()(_samples(images)) == pytest.approx(expected, rel=1e-5)
    assert Saturation()(_samples(_images(2, 1))) == 0.0


def test_dark_fraction_counts_the_pixels_below_the_threshold() -> None:
    images = _images(3, 1, size=6)
    expected = np.mean([[v < 0.3 for v in image.flatten().tolist()] for image in images])
    assert DarkFraction(threshold=0.3)(_samples(images)) == pytest.approx(expected)
    with pytest.raises(FlowpostError, match=r"options\.threshold: threshold must be a number in \(0, 1\]"):
        DarkFraction(threshold=2)


def test_high_frequency_energy_matches_a_direct_fourier_sum() -> None:
    size = 8
    images = _images(2, 1, size=size, seed=3).double()
    frequencies = [k / size if k < size / 2 else (k - size) / size for k in range(size)]
    expected = []
    for image in images[:, 0].numpy():
        centred = image - image.mean()
        high = total = 0.0
        for u, fu in enumerate(frequencies):
            for v, fv in enumerate(frequencies):
                coefficient = sum(
                    centred[y, x] * np.exp(-2j * np.pi * (u * y + v * x) / size)
                    for y in range(size)
                    for x in range(size)
                )
                power = abs(coefficient) ** 2
                total += power
                high += power if (fu**2 + fv**2) ** 0.5 > 0.25 else 0.0
        expected.append(high / total)
    assert HighFrequencyEnergy(cutoff=0.25)(_samples(images)) == pytest.approx(float(np.mean(expected)), rel=1e-9)


def test_high_frequency_energy_separates_a_checkerboard_from_a_gradient_and_a_flat_image() -> None:
    y, x = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    checkerboard = ((y + x) % 2).float()[None, None]
    gradient = (x / 7).float()[None, None]
    flat = torch.full((1, 1, 8, 8), 0.5)
    energy = statistics.high_frequency_energy(torch.cat([checkerboard, gradient, flat]), cutoff=0.25)
    assert energy[0] == pytest.approx(1.0) and energy[1] < 0.2 and energy[2] == 0.0


def test_duplicate_rate_counts_repeats_within_a_prompt_only() -> None:
    base = _images(3, 1, seed=5)
    images = torch.cat([base[0:1], base[0:1] + 0.001, base[1:2], base[0:1], base[2:3]])
    prompts = ["a", "a", "a", "b", "b"]  # sample 1 repeats sample 0; sample 3 repeats 0 under another prompt
    assert DuplicateRate(threshold=0.01)(_samples(images, prompts)) == pytest.approx(1 / 5)
    assert DuplicateRate(threshold=0.01)(_samples(images, ["a"] * 5)) == pytest.approx(2 / 5)


def test_statistics_stay_on_the_images_device_and_dtype() -> None:
    images = _images(2, 3).double()
    for values in (
        statistics.brightness(images),
        statistics.saturation(images),
        statistics.dark_fraction(images, threshold=0.5),
        statistics.high_frequency_energy(images, cutoff=0.25),
    ):
        assert values.dtype == torch.float64 and values.device == images.device and values.shape == (2,)
