from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch import Tensor

from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.rewards.jpeg import JpegCompressibility, JpegIncompressibility
from flowpost.core.rewards.registry import REWARDS, build_reward
from flowpost.errors import FlowpostError
from flowpost_digits.classifier import DigitClassifier, save_classifier


def _pil_jpeg_kb(array: np.ndarray) -> float:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=95)
    return len(buffer.getvalue()) / 1000


@pytest.mark.parametrize("channels", [1, 3])
def test_noise_is_less_compressible_than_a_flat_image(channels: int) -> None:
    generator = torch.Generator().manual_seed(0)
    media = torch.stack([torch.full((channels, 32, 32), 0.5), torch.rand(channels, 32, 32, generator=generator)])
    incompressibility = JpegIncompressibility()(media, ["", ""], [{}, {}])
    assert incompressibility.dtype == torch.float32 and incompressibility.shape == (2,)
    assert incompressibility[1] > incompressibility[0] > 0
    assert torch.equal(JpegCompressibility()(media, ["", ""], [{}, {}]), -incompressibility)


def test_size_matches_pil_on_the_same_pixels() -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (24, 20), dtype=np.uint8)
    rgb_media = torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255
    gray_media = torch.from_numpy(gray)[None, None].float() / 255
    reward = JpegIncompressibility()
    assert reward(rgb_media, [""], [{}]).item() == pytest.approx(_pil_jpeg_kb(rgb))
    assert reward(gray_media, [""], [{}]).item() == pytest.approx(_pil_jpeg_kb(gray))


def test_jpeg_rejects_other_channel_counts() -> None:
    with pytest.raises(FlowpostError, match="grayscale or RGB"):
        JpegIncompressibility()(torch.zeros(1, 4, 8, 8), [""], [{}])


class Constant:
    def __init__(self, name: str, values: list[float]) -> None:
        self.name = name
        self.values = torch.tensor(values)

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return self.values


def test_weighted_sum_and_metrics() -> None:
    rewards = WeightedRewards([(Constant("a", [1.0, 3.0]), 2.0), (Constant("b", [4.0, 0.0]), -0.5)])
    output = rewards(torch.zeros(2, 1, 4, 4), ["x", "y"], [{}, {}])
    torch.testing.assert_close(output.total, torch.tensor([0.0, 6.0]))
    assert set(output.components) == {"a", "b"}
    torch.testing.assert_close(output.components["b"], torch.tensor([4.0, 0.0]))
    assert rewards.metrics(output) == {
        "reward/a_mean": 2.0,
        "reward/a_std": 1.0,
        "reward/b_mean": 2.0,
        "reward/b_std": 2.0,
        "reward/total_mean": 3.0,
    }


def test_duplicate_names_and_bad_shapes_are_rejected() -> None:
    with pytest.raises(FlowpostError, match="listed twice") as info:
        WeightedRewards([(Constant("a", [1.0]), 1.0), (Constant("a", [2.0]), 1.0)], where="stages.grpo.rewards")
    assert info.value.where == "stages.grpo.rewards.1.name"
    with pytest.raises(FlowpostError, match="at least one"):
        WeightedRewards([])
    with pytest.raises(FlowpostError, match=r"returned \(3,\), expected \(2,\)"):
        WeightedRewards([(Constant("a", [1.0, 2.0, 3.0]), 1.0)])(torch.zeros(2, 1, 4, 4), ["", ""], [{}, {}])


def test_registry_builds_the_jpeg_rewards() -> None:
    for name in ("jpeg_compressibility", "jpeg_incompressibility"):
        reward = build_reward(name, options={}, where="stages.grpo.rewards.0")
        assert reward.name == name
        assert reward(torch.rand(2, 3, 8, 8), ["", ""], [{}, {}]).shape == (2,)


def test_registry_builds_digit_adherence(tmp_path: Path) -> None:
    torch.manual_seed(0)
    save_classifier(DigitClassifier(width=16), tmp_path, "digits-reward")
    reward = build_reward("digit_adherence", options={"assets_dir": tmp_path}, where="stages.grpo.rewards.0")
    assert reward.name == "digit_adherence"
    media = torch.rand(3, 1, 16, 16)
    per_label = torch.stack([reward(media, [""] * 3, [{"label": label}] * 3) for label in range(10)])
    assert per_label.shape == (10, 3)
    assert ((per_label >= 0) & (per_label <= 1)).all()
    torch.testing.assert_close(per_label.sum(0), torch.ones(3))
    string_labels = reward(media, [""] * 3, [{"label": "4"}] * 3)  # csv prompt files hold text
    torch.testing.assert_close(string_labels, per_label[4])
    with pytest.raises(FlowpostError, match=r"prompt 'a seven': label None is not an integer; give it one"):
        reward(media, ["a three", "a seven", "x"], [{"label": 3}, {}, {"label": 1}])
    for label, reason in [(1.9, "not an integer"), (True, "a boolean"), (10, "out of range"), ("-1", "not an integer")]:
        with pytest.raises(FlowpostError, match=f"label {label!r} is {reason}"):
            reward(media[:1], ["a one"], [{"label": label}])
    with pytest.raises(FlowpostError, match=r"grayscale 16x16 images \[B, 1, 16, 16\], got \(2, 3, 16, 16\)"):
        reward(torch.rand(2, 3, 16, 16), ["", ""], [{"label": 1}] * 2)
    with pytest.raises(FlowpostError, match=r"got \(2, 1, 28, 28\)"):
        reward(torch.rand(2, 1, 28, 28), ["", ""], [{"label": 1}] * 2)


def test_registry_errors_name_the_config_path() -> None:
    known = sorted({*REWARDS, "digit_adherence"})  # the built-ins and the digits extra's entry point
    with pytest.raises(FlowpostError, match="known rewards: " + ", ".join(known)) as info:
        build_reward("no_such_reward", options={}, where="stages.grpo.rewards.0.name")
    assert info.value.where == "stages.grpo.rewards.0.name"
    with pytest.raises(FlowpostError, match="accepted parameters: none") as info:
        build_reward("jpeg_compressibility", options={"quality": 90}, where="stages.grpo.rewards.1")
    assert info.value.where == "stages.grpo.rewards.1"
    with pytest.raises(FlowpostError, match="accepted parameters: assets_dir"):
        build_reward("digit_adherence", options={}, where="stages.grpo.rewards.2")
