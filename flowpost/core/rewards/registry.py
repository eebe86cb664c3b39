"""Static registry of reward scorers (lazy imports)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from flowpost.core.lazy import import_registered
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.rewards.base import Reward

REWARDS: dict[str, str] = {
    "clip_score": "flowpost.core.rewards.clip:ClipScore",
    "digit_adherence": "flowpost.core.rewards.digit_adherence:DigitAdherence",
    "jpeg_compressibility": "flowpost.core.rewards.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "flowpost.core.rewards.jpeg:JpegIncompressibility",
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
    reward_class = _reward_class(name, where)
    signature = inspect.signature(reward_class)
    try:
        signature.bind(**options)
    except TypeError as exc:
        accepted = [
            parameter.name
            for parameter in signature.parameters.values()
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        ]
        raise FlowpostError(
            f"bad options for reward {name!r} ({exc}); accepted parameters: {', '.join(accepted) or 'none'}",
            where=where,
        ) from None
    try:
        return reward_class(**options)
    except FlowpostError as exc:
        if exc.where is None or not exc.where.startswith("options."):
            raise
        raise FlowpostError(str(exc).removeprefix(f"{exc.where}: "), where=f"{where}.{exc.where}") from None
