"""The registries ``flowpost list`` prints: trainers, model families, rewards, evaluation metrics."""

from __future__ import annotations

from flowpost.core.evaluation.registry import METRICS
from flowpost.core.models.registry import FAMILIES
from flowpost.core.rewards.registry import REWARDS
from flowpost.core.trainers.registry import TRAINERS
from flowpost.errors import FlowpostError

REGISTRIES = {"trainers": TRAINERS, "models": FAMILIES, "rewards": REWARDS, "metrics": {**METRICS, **REWARDS}}


def registry(what: str) -> dict[str, str]:
    """Name -> import target of registry ``what``, sorted by name."""
    if what not in REGISTRIES:
        raise FlowpostError(
            f"unknown registry {what!r}; use trainers, models, rewards or metrics", where="flowpost list"
        )
    return dict(sorted(REGISTRIES[what].items()))
