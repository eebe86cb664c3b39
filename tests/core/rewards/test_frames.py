"""Image rewards on video: the first frame, evenly sampled frames or the whole clip, by the reward's config."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flowpost.core.config.schema import RewardConfig
from flowpost.core.rewards.frames import FrameSelection, sampled_frame_indices
from flowpost.core.rewards.jpeg import JpegIncompressibility
from flowpost.errors import FlowpostError

WHERE = "stages.grpo.rewards.0"


class MeanBrightness:
    """Scores images by their mean pixel; records what it was called with."""

    name = "brightness"

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], list[str], list[dict[str, Any]]]] = []

    def __call__(self, media: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> torch.Tensor:
        self.calls.append((tuple(media.shape), prompts, metadata))
        return media.flatten(1).mean(1)


def _clips() -> torch.Tensor:
    """Two clips of 5 frames whose frame ``t`` of clip ``b`` is the constant ``(b + 1) * t / 10``."""
    levels = torch.arange(5.0).view(1, 1, 5, 1, 1) * torch.tensor([1.0, 2.0]).view(2, 1, 1, 1, 1) / 10
    return levels.expand(2, 3, 5, 4, 6).clone()


def test_sampled_frames_are_spread_from_first_to_last() -> None:
    assert sampled_frame_indices(81, 4) == [0, 27, 53, 80]
    assert sampled_frame_indices(5, 1) == [0]
    assert sampled_frame_indices(3, 8) == [0, 1, 2]  # a short clip: each frame once


@pytest.mark.parametrize(("frames", "expected"), [("first", [0.0, 0.0]), ("sampled", [0.2, 0.4]), ("clip", [0.2, 0.4])])
def test_each_choice_scores_its_frames(frames: str, expected: list[float]) -> None:
    reward = MeanBrightness()
    scores = FrameSelection(reward, frames=frames, sampled_frames=3, where=WHERE)(_clips(), ["a", "b"], [{}, {"k": 1}])
    torch.testing.assert_close(scores, torch.tensor(expected))
    shape, prompts, metadata = reward.calls[0]
    if frames == "sampled":  # frames 0, 2, 4 of each clip, scored as images with their clip's prompt
        assert shape == (6, 3, 4, 6) and prompts == ["a"] * 3 + ["b"] * 3 and metadata[3:] == [{"k": 1}] * 3
    else:
        assert shape == ((2, 3, 4, 6) if frames == "first" else (2, 3, 5, 4, 6))


def test_images_reach_the_reward_unchanged() -> None:
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    jpeg = JpegIncompressibility()
    for frames in (None, "first", "sampled"):
        scores = FrameSelection(jpeg, frames=frames, where=WHERE)(images, ["p"] * 3, [{}] * 3)
        assert torch.equal(scores, jpeg(images, ["p"] * 3, [{}] * 3))


def test_a_video_without_a_frame_choice_names_the_setting() -> None:
    with pytest.raises(FlowpostError, match=rf"{WHERE}\.frames: .*first, sampled .* or clip"):
        FrameSelection(MeanBrightness(), frames=None, where=WHERE)(_clips(), ["a", "b"], [{}, {}])


def test_the_config_keeps_image_rewards_params_and_checks_the_count() -> None:
    assert RewardConfig.model_validate({"name": "x"}).model_dump() == {"name": "x", "weight": 1.0, "options": {}}
    sampled = RewardConfig.model_validate({"name": "x", "frames": "sampled", "sampled_frames": 8}).model_dump()
    assert (sampled["frames"], sampled["sampled_frames"]) == ("sampled", 8)
    with pytest.raises(ValueError, match="sampled_frames applies only to frames: sampled"):
        RewardConfig.model_validate({"name": "x", "frames": "first", "sampled_frames": 2})
