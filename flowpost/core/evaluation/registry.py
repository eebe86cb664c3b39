"""The evaluation metrics: the built-ins (a static dict imported lazily) and plugins; every reward scorer is a
metric too (the mean of its scores)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowpost.core.lazy import import_object
from flowpost.core.plugins import Entry, Registry, is_path
from flowpost.core.rewards.base import compares_groups
from flowpost.core.rewards.metadata_fields import metadata_fields
from flowpost.core.rewards.registry import REWARD_REGISTRY
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.evaluation.samples import Better, Metric

METRICS: dict[str, str] = {
    "brightness": "flowpost.core.evaluation.image_metrics:Brightness",
    "dark_fraction": "flowpost.core.evaluation.image_metrics:DarkFraction",
    "duplicate_rate": "flowpost.core.evaluation.image_metrics:DuplicateRate",
    "fd_clip": "flowpost.core.evaluation.feature_frechet:ClipFrechet",
    "fd_dinov2": "flowpost.core.evaluation.feature_frechet:Dinov2Frechet",
    "high_frequency": "flowpost.core.evaluation.image_metrics:HighFrequencyEnergy",
    "saturation": "flowpost.core.evaluation.image_metrics:Saturation",
}
METRIC_REGISTRY = Registry(
    "metric",
    plural="metrics",
    group="flowpost.metrics",
    builtins=METRICS,
    base="flowpost.core.evaluation.samples:Metric",
)
_GROUPS = (
    "reward {name!r} compares the samples of a rollout group with each other, and evaluation samples form no "
    "groups; score it in an online RL stage, or evaluate with a pointwise reward (e.g. vlm_judge)"
)
ASSETS = "assets_dir"  # the option a metric or reward reading its dataset's assets/ gets from the evaluation dataset


def metric_entries(*, where: str) -> dict[str, Entry]:
    """Every name ``evaluate.metrics`` accepts, sorted: the metrics and the reward scorers. A plugin metric
    named like a reward is an error naming ``where``."""
    metrics, rewards = METRIC_REGISTRY.entries(where=where), REWARD_REGISTRY.entries(where=where)
    if both := sorted(set(metrics) & set(rewards)):
        raise FlowpostError(
            f"{both[0]!r} names a metric ({metrics[both[0]].target}) and a reward ({rewards[both[0]].target}); "
            "rename the plugin's entry point",
            where=where,
        )
    return dict(sorted({**metrics, **rewards}.items()))


def _registry(name: str, where: str) -> Registry:
    """The registry whose class ``name`` scores with: the rewards' (a reward's class, or one written as a path
    that implements a reward) or the metrics'."""
    if is_path(name):
        cls = import_object(name, what=f"metric {name!r}", where=where)
        return REWARD_REGISTRY if REWARD_REGISTRY.mismatch(cls) is None else METRIC_REGISTRY
    entries = metric_entries(where=where)
    if name not in entries:
        raise FlowpostError(METRIC_REGISTRY.unknown(name, entries), where=where)
    return REWARD_REGISTRY if name in REWARD_REGISTRY.entries(where=where) else METRIC_REGISTRY


def metric_problem(name: str, *, where: str) -> str | None:
    """Why ``name`` cannot be scored as a metric (``where: message``), or None (see ``Registry.problem``)."""
    try:
        registry = _registry(name, where)
        if registry is REWARD_REGISTRY and compares_groups(registry.load(name, where=where)):
            raise FlowpostError(_GROUPS.format(name=name), where=where)
    except FlowpostError as exc:
        return str(exc)
    return registry.problem(name, where=where)


def metric_parameters(name: str, *, where: str) -> list[str]:
    """Names of the options the metric (or reward) ``name`` accepts."""
    return list(inspect.signature(_registry(name, where).load(name, where=where)).parameters)


def metric_class(name: str, *, where: str) -> type:
    """The class the metric (or reward) ``name`` is built from."""
    return _registry(name, where).load(name, where=where)


def metric_metadata_fields(name: str, *, where: str) -> tuple[str, ...]:
    """The prompt metadata fields the metric (or reward) ``name`` reads (``metadata_fields``)."""
    return metadata_fields(metric_class(name, where=where))


def metric_reads_reference(name: str, *, where: str) -> bool:
    """Whether the metric ``name`` compares the samples with held-out real images (its class's
    ``reads_reference``)."""
    return bool(getattr(_registry(name, where).load(name, where=where), "reads_reference", False))


def metric_direction(name: str, *, where: str) -> Better | None:
    """Which direction of the metric (or reward) ``name`` is better: ``higher`` for a reward (what training
    raises), else its class's ``better``; None when it declares none."""
    registry = _registry(name, where)
    if registry is REWARD_REGISTRY:
        return "higher"
    better = getattr(registry.load(name, where=where), "better", None)
    if better not in (None, "higher", "lower"):
        raise FlowpostError(
            f"metric {name!r} declares better = {better!r}; it must be 'higher' or 'lower'", where=where
        )
    return better


def build_metric(name: str, *, options: dict[str, Any], where: str, assets_dir: Path | None) -> Metric:
    """The metric ``name`` stands for (a reward becomes the mean of its scores), constructed with ``options``;
    one that takes ``assets_dir`` gets the evaluation dataset's ``assets/`` unless its options name one."""
    from flowpost.core.evaluation.reward_metric import RewardMetric

    options = dict(options)
    if ASSETS in metric_parameters(name, where=where) and ASSETS not in options:
        if assets_dir is None:
            raise FlowpostError(
                f"metric {name!r} reads the assets its dataset's acquisition writes; set evaluate.dataset to a "
                "dataset of the source it belongs to, or give options.assets_dir",
                where=where,
            )
        options[ASSETS] = assets_dir
    registry = _registry(name, where)
    if registry is REWARD_REGISTRY and compares_groups(registry.load(name, where=where)):
        raise FlowpostError(_GROUPS.format(name=name), where=where)
    if registry is REWARD_REGISTRY:
        return RewardMetric(registry.build(name, options=options, where=where))
    return registry.build(name, options=options, where=where)
