"""The reward protocol."""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class Reward(Protocol):
    """Scores a batch: ``media`` [B, C, H, W] in [0, 1], one prompt and metadata dict per sample; a reward
    entry with ``frames: clip`` gets videos [B, C, T, H, W] (``FrameSelection``).

    A reward whose class sets ``compares = "group"`` scores each sample against the others of its rollout
    group (``metadata["group_id"]``): it gets whole groups in one call, and only online RL stages use it.
    """

    name: str

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor: ...


def compares_groups(reward: object) -> bool:
    """Whether ``reward`` (a class or an instance) compares the samples of a group (``compares = "group"``)."""
    return getattr(reward, "compares", None) == "group"
