"""Static registry of reward scorers (lazy imports)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from flowpost.core.lazy import construct, import_registered

if TYPE_CHECKING:
    from flowpost.core.rewards.base import Reward

REWARDS: dict[str, str] = {
    "aesthetic": "flowpost.core.rewards.aesthetic:AestheticScore",
    "clip_score": "flowpost.core.rewards.clip:ClipScore",
    "digit_adherence": "flowpost.core.rewards.digit_adherence:DigitAdherence",
    "jpeg_compressibility": "flowpost.core.rewards.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "flowpost.core.rewards.jpeg:JpegIncompressibility",
    "mean_brightness": "flowpost.core.rewards.brightness:BrightnessReward",
    "ocr": "flowpost.core.rewards.ocr:OcrReward",
    "pickscore": "flowpost.core.rewards.clip:PickScore",
    "remote": "flowpost.core.rewards.remote:RemoteReward",
}


def _reward_class(name: str, where: str) -> type:
    return import_registered(REWARDS, name, kind="reward", where=where)


def reward_parameters(name: str, *, where: str) -> list[str]:
    """Names of the options the reward registered as ``name`` accepts."""
    return list(inspect.signature(_reward_class(name, where)).parameters)


def build_reward(name: str, *, options: dict[str, Any], where: str) -> Reward:
    """Import the reward registered as ``name`` and construct it with ``options``.

    ``where`` is the config path of this reward entry, used in error messages; a scorer's error whose
    ``where`` starts with ``options.`` is reported under this entry.
    """
    return construct(_reward_class(name, where), kind="reward", name=name, options=options, where=where)
