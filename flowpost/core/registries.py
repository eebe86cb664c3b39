"""The registries ``flowpost list`` prints: trainers, model families, rewards, evaluation metrics, dataset
sources and text encoders."""

from __future__ import annotations

from flowpost.core.datasets import DATASET_REGISTRY
from flowpost.core.evaluation.registry import metric_entries
from flowpost.core.models.registry import FAMILY_REGISTRY
from flowpost.core.models.text_encoders import ENCODER_REGISTRY
from flowpost.core.plugins import Entry
from flowpost.core.rewards.registry import REWARD_REGISTRY
from flowpost.core.trainers.registry import TRAINER_REGISTRY
from flowpost.errors import FlowpostError

WHERE = "flowpost list"
REGISTRIES = {
    "trainers": TRAINER_REGISTRY,
    "models": FAMILY_REGISTRY,
    "rewards": REWARD_REGISTRY,
    "datasets": DATASET_REGISTRY,
    "encoders": ENCODER_REGISTRY,
}


def registry(what: str) -> dict[str, Entry]:
    """Name -> entry (its import target and, for a plugin, its distribution) of registry ``what``, sorted."""
    if what == "metrics":
        return metric_entries(where=WHERE)
    if what not in REGISTRIES:
        known = ", ".join(["trainers", "models", "rewards", "metrics", "datasets"])
        raise FlowpostError(f"unknown registry {what!r}; use {known} or encoders", where=WHERE)
    return REGISTRIES[what].entries(where=WHERE)
