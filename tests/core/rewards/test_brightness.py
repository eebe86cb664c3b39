"""The mean_brightness reward: each image's mean luma, on the images' dtype; the brightness metric's value."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError


def test_brightness_is_each_images_mean_luma() -> None:
    reward = build_reward("mean_brightness", options={}, where="stages.grpo.rewards.0")
    grey = torch.stack([torch.full((1, 4, 4), 0.25), torch.ones(1, 4, 4)]).double()
    assert torch.equal(reward(grey, ["a", "b"], [{}, {}]), torch.tensor([0.25, 1.0], dtype=torch.float64))
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 1.0
    assert torch.allclose(reward(red, ["a"], [{}]), torch.tensor([0.299]))


def test_a_brighter_image_scores_higher_whatever_it_shows() -> None:
    reward = build_reward("mean_brightness", options={}, where="rewards.0")
    digit = torch.zeros(1, 1, 8, 8)
    digit[..., 2:6, 3:5] = 1.0
    assert float(reward(digit.clamp_min(0.5), [""], [{}])) > float(reward(digit, [""], [{}]))


def test_the_brightness_metric_is_its_mean() -> None:
    images = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    samples = EvalSamples(images=images, prompts=[""] * 6, metadata=[{}] * 6)
    metric = build_metric("brightness", options={}, where="evaluate.metrics.0", assets_dir=None)
    reward = build_reward("mean_brightness", options={}, where="rewards.0")
    assert metric(samples) == pytest.approx(float(reward(images, samples.prompts, samples.metadata).mean()))


def test_video_or_odd_channels_are_refused() -> None:
    reward = build_reward("mean_brightness", options={}, where="rewards.0")
    with pytest.raises(FlowpostError, match=r"\[B, 1 or 3, H, W\], got \(1, 2, 4, 4\)"):
        reward(torch.zeros(1, 2, 4, 4), [""], [{}])
