"""Static registry of reward scorers (lazy imports)."""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.rewards.base import Reward

REWARDS: dict[str, str] = {
    "digit_adherence": "flowpost.core.rewards.digit_adherence:DigitAdherence",
    "jpeg_compressibility": "flowpost.core.rewards.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "flowpost.core.rewards.jpeg:JpegIncompressibility",
}


def build_reward(name: str, *, options: dict[str, Any], where: str) -> Reward:
    """Import the reward registered as ``name`` and construct it with ``options``.

    ``where`` is the config path of this reward entry, used in error messages.
    """
    if name not in REWARDS:
        known = ", ".join(sorted(REWARDS))
        raise FlowpostError(f"unknown reward {name!r}; known rewards: {known}", where=where)
    module, _, attr = REWARDS[name].partition(":")
    reward_class = getattr(importlib.import_module(module), attr)
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
    return reward_class(**options)
