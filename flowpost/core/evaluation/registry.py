"""Static registry of evaluation metrics (lazy imports); every reward scorer is a metric too."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowpost.core.lazy import construct, import_registered
from flowpost.core.rewards.registry import REWARDS, build_reward, reward_parameters
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.evaluation.samples import Metric

METRICS: dict[str, str] = {
    "adherence": "flowpost.core.evaluation.digit_judge:DigitJudgeAdherence",
    "brightness": "flowpost.core.evaluation.image_metrics:Brightness",
    "dark_fraction": "flowpost.core.evaluation.image_metrics:DarkFraction",
    "duplicate_rate": "flowpost.core.evaluation.image_metrics:DuplicateRate",
    "fd": "flowpost.core.evaluation.digit_judge:DigitJudgeFrechet",
    "fd_clip": "flowpost.core.evaluation.feature_frechet:ClipFrechet",
    "fd_dinov2": "flowpost.core.evaluation.feature_frechet:Dinov2Frechet",
    "high_frequency": "flowpost.core.evaluation.image_metrics:HighFrequencyEnergy",
    "saturation": "flowpost.core.evaluation.image_metrics:Saturation",
}
ASSETS = "assets_dir"  # the option a digits-classifier metric or reward gets from the evaluation dataset


def metric_names() -> list[str]:
    """Every name ``evaluate.metrics`` accepts: the metrics and the reward scorers."""
    return sorted({*METRICS, *REWARDS})


def metric_parameters(name: str, *, where: str) -> list[str]:
    """Names of the options the metric (or reward) registered as ``name`` accepts."""
    if name in REWARDS:
        return reward_parameters(name, where=where)
    cls = import_registered({**METRICS, **REWARDS}, name, kind="metric", where=where)
    return list(inspect.signature(cls).parameters)


def build_metric(name: str, *, options: dict[str, Any], where: str, assets_dir: Path | None) -> Metric:
    """The metric registered as ``name`` (a reward becomes the mean of its scores), constructed with
    ``options``; one that reads the digit classifiers gets ``assets_dir`` unless its options name one."""
    from flowpost.core.evaluation.reward_metric import RewardMetric

    options = dict(options)
    if ASSETS in metric_parameters(name, where=where) and ASSETS not in options:
        if assets_dir is None:
            raise FlowpostError(
                f"metric {name!r} reads the digit classifiers of a builtin-digits dataset; set evaluate.dataset "
                "to one, or give options.assets_dir",
                where=where,
            )
        options[ASSETS] = assets_dir
    if name in REWARDS:
        return RewardMetric(build_reward(name, options=options, where=where))
    cls = import_registered(METRICS, name, kind="metric", where=where)
    return construct(cls, kind="metric", name=name, options=options, where=where)
