"""The reward scorers: the built-ins (a static dict imported lazily) and plugins."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from flowpost.core.plugins import Registry

if TYPE_CHECKING:
    from flowpost.core.rewards.base import Reward

REWARDS: dict[str, str] = {
    "aesthetic": "flowpost.core.rewards.aesthetic:AestheticScore",
    "clip_score": "flowpost.core.rewards.clip:ClipScore",
    "geneval": "flowpost.core.rewards.geneval:GenevalReward",
    "hpsv2": "flowpost.core.rewards.hps:HpsV2",
    "imagereward": "flowpost.core.rewards.imagereward:ImageReward",
    "jpeg_compressibility": "flowpost.core.rewards.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "flowpost.core.rewards.jpeg:JpegIncompressibility",
    "mean_brightness": "flowpost.core.rewards.brightness:BrightnessReward",
    "ocr": "flowpost.core.rewards.ocr:OcrReward",
    "pickscore": "flowpost.core.rewards.clip:PickScore",
    "remote": "flowpost.core.rewards.remote:RemoteReward",
    "vlm_edit_judge": "flowpost.core.rewards.vlm_judge:VlmEditJudge",
    "vlm_judge": "flowpost.core.rewards.vlm_judge:VlmJudge",
    "vlm_pairwise_judge": "flowpost.core.rewards.vlm_judge:VlmPairwiseJudge",
}
REWARD_REGISTRY = Registry(
    "reward", plural="rewards", group="flowpost.rewards", builtins=REWARDS, base="flowpost.core.rewards.base:Reward"
)


def reward_parameters(name: str, *, where: str) -> list[str]:
    """Names of the options the reward ``name`` accepts."""
    return list(inspect.signature(REWARD_REGISTRY.load(name, where=where)).parameters)


def build_reward(name: str, *, options: dict[str, Any], where: str) -> Reward:
    """Import the reward ``name`` stands for and construct it with ``options``.

    ``where`` is the config path of this reward entry, used in error messages; a scorer's error whose
    ``where`` starts with ``options.`` is reported under this entry.
    """
    return REWARD_REGISTRY.build(name, options=options, where=where)
