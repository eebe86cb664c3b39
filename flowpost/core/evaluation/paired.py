"""A stage against its base model on the same prompts and noise: per metric the base's value, the difference
and its 95 % interval over paired units (samples for a metric that scores each sample, seeds otherwise)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowpost.core.evaluation.intervals import summarize

CATEGORY_FIELDS = ("category", "tag")  # prompt metadata naming a prompt's category: DrawBench's, GenEval's


@dataclass(frozen=True)
class Scores:
    """One model's scores: a row per seed (``seed`` and each value), each sample's score (samples of all
    seeds in order) for the values scored sample by sample, and each sample's category (None without one)."""

    per_seed: list[dict[str, Any]]
    per_sample: dict[str, list[float]] = field(default_factory=dict)
    categories: list[str | None] = field(default_factory=list)

    def keys(self) -> list[str]:
        return [key for key in self.per_seed[0] if key != "seed"]


def sample_category(metadata: dict[str, Any]) -> str | None:
    """The prompt's category: its ``category`` (DrawBench) or ``tag`` (GenEval), else None."""
    for name in CATEGORY_FIELDS:
        if isinstance(value := metadata.get(name), str) and value:
            return value
    return None


def per_category(scores: Scores) -> dict[str, dict[str, float]]:
    """``{key: {category: mean}}`` for each value scored sample by sample, when every sample has a category."""
    if not scores.categories or any(category is None for category in scores.categories):
        return {}
    names = sorted({str(category) for category in scores.categories})
    result: dict[str, dict[str, float]] = {}
    for key, values in scores.per_sample.items():
        result[key] = {}
        for name in names:
            chosen = [value for value, category in zip(values, scores.categories, strict=True) if category == name]
            result[key][name] = math.fsum(chosen) / len(chosen)
    return result


def compare_with_base(candidate: Scores, base: Scores) -> dict[str, dict[str, Any]]:
    """``{key: {base, difference, interval, paired, n}}``: the base's value (its mean over seeds), the mean of
    the paired differences candidate − base, their 95 % Student-t interval (left out for a single unit), what
    was paired (``samples`` where both score each sample, else ``seeds``) and how many pairs."""
    if [row["seed"] for row in candidate.per_seed] != [row["seed"] for row in base.per_seed]:
        raise ValueError("the candidate and the base were scored with different seeds")
    result: dict[str, dict[str, Any]] = {}
    for key in candidate.keys():
        base_by_seed = [float(row[key]) for row in base.per_seed]
        if key in candidate.per_sample and key in base.per_sample:
            paired, pairs = "samples", _pairs(candidate.per_sample[key], base.per_sample[key])
        else:
            paired, pairs = "seeds", _pairs([float(row[key]) for row in candidate.per_seed], base_by_seed)
        summary = summarize([new - old for new, old in pairs])
        entry: dict[str, Any] = {
            "base": math.fsum(base_by_seed) / len(base_by_seed),
            "difference": summary.mean,
            "paired": paired,
            "n": summary.n,
        }
        if summary.n > 1:
            entry["interval"] = [summary.low, summary.high]
        result[key] = entry
    return result


def _pairs(new: Sequence[float], old: Sequence[float]) -> list[tuple[float, float]]:
    if len(new) != len(old):
        raise ValueError(f"{len(new)} candidate values cannot pair with {len(old)} base values")
    return list(zip(new, old, strict=True))
