"""Image rewards on video: which frames of a clip ``[B, C, T, H, W]`` a reward scores."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from flowpost.core.rewards.base import Reward, compares_groups
from flowpost.errors import FlowpostError

FrameChoice = Literal["first", "sampled", "clip"]
SAMPLED_FRAMES = 4  # frames ``sampled`` scores when the config names no count


def sampled_frame_indices(frames: int, count: int) -> list[int]:
    """``count`` frame indices spread evenly from the first frame to the last (fewer when the clip is shorter)."""
    if count == 1:
        return [0]
    return sorted({round(i * (frames - 1) / (count - 1)) for i in range(count)})


class FrameSelection:
    """``reward`` on the frames ``frames`` names: ``first`` scores frame 0, ``sampled`` the mean over
    ``sampled_frames`` evenly spaced frames (each scored as an image, with its clip's prompt and metadata),
    ``clip`` hands the whole video to a reward that scores clips.

    Images ``[B, C, H, W]`` go to ``reward`` unchanged; a video with no ``frames`` chosen is an error naming
    ``where`` (the reward's config entry). A reward comparing groups (``compares = "group"``) stays one: it
    scores each sampled frame across the batch, so only the same frame of a group's clips is compared.
    """

    def __init__(
        self, reward: Reward, *, frames: FrameChoice | None, sampled_frames: int | None = None, where: str
    ) -> None:
        self.reward = reward
        self.name = reward.name
        self.frames = frames
        self.sampled_frames = sampled_frames or SAMPLED_FRAMES
        self.where = where
        if compares_groups(reward):
            self.compares = "group"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if media.ndim != 5 or self.frames == "clip":
            return self.reward(media, prompts, metadata)
        if self.frames is None:
            raise FlowpostError(
                f"reward {self.name!r} got videos {tuple(media.shape)} [B, C, T, H, W]; say which frames it scores: "
                "frames: first, sampled (sampled_frames: N) or clip",
                where=f"{self.where}.frames",
            )
        if self.frames == "first":
            return self.reward(media[:, :, 0], prompts, metadata)
        batch, channels, length, height, width = media.shape
        chosen = sampled_frame_indices(length, self.sampled_frames)
        if compares_groups(self.reward):
            per_frame = [torch.as_tensor(self.reward(media[:, :, f], prompts, metadata)) for f in chosen]
            return torch.stack(per_frame).mean(dim=0)
        frames = media[:, :, chosen].transpose(1, 2).reshape(batch * len(chosen), channels, height, width)
        repeat = len(chosen)
        scores = self.reward(
            frames, [p for p in prompts for _ in range(repeat)], [m for m in metadata for _ in range(repeat)]
        )
        return torch.as_tensor(scores).reshape(batch, repeat).mean(dim=1)
