"""What of a config section its node's fingerprint (and the DVC params of its stage) leaves out."""

from __future__ import annotations

from typing import Any

from flowpost.core.config.base import StrictModel
from flowpost.core.config.schema.evaluation import EvaluateConfig
from flowpost.core.config.schema.export import ExportConfig
from flowpost.core.config.schema.stages import StageConfig

UNFINGERPRINTED: dict[type[StrictModel], tuple[str, ...]] = {  # section -> dotted keys no result depends on
    # trackers only log; the timeout only watches; offloaded weights give the same results as resident ones
    StageConfig: ("callbacks.trackers", "launch.hang_timeout", "offload"),
    EvaluateConfig: ("after",),  # which other stages are evaluated does not change one stage's evaluation
    ExportConfig: ("promote",),  # the promotion gate is the promote node's
}


def fingerprinted(section: StrictModel) -> dict[str, Any]:
    """``section`` as plain data (its YAML keys) without what ``UNFINGERPRINTED`` leaves out."""
    return _without(section.model_dump(mode="json", by_alias=True), UNFINGERPRINTED.get(type(section), ()))


def fingerprinted_keys(path: str, section: StrictModel) -> list[str]:
    """The dotted keys under ``path`` (where ``section`` sits in the pipeline file) that its fingerprint reads:
    ``path`` itself when nothing of it is left out, else its keys, a mapping part of which is left out by its
    own keys (those read whole first)."""
    return _read_keys(path, section.model_dump(mode="json", by_alias=True), UNFINGERPRINTED.get(type(section), ()))


def _without(data: dict[str, Any], left_out: tuple[str, ...]) -> dict[str, Any]:
    kept = dict(data)
    for key, value in data.items():
        inner = _inside(key, left_out)
        if key in left_out:
            del kept[key]
        elif inner and isinstance(value, dict):
            kept[key] = _without(value, inner)
    return kept


def _read_keys(path: str, data: dict[str, Any], left_out: tuple[str, ...]) -> list[str]:
    if not any(key in left_out or _inside(key, left_out) for key in data):
        return [path]
    whole, parts = [], []
    for key, value in data.items():
        inner = _inside(key, left_out)
        if key in left_out:
            continue
        if inner and isinstance(value, dict):
            parts += _read_keys(f"{path}.{key}", value, inner)
        else:
            whole.append(f"{path}.{key}")
    return whole + parts


def _inside(key: str, left_out: tuple[str, ...]) -> tuple[str, ...]:
    """The keys of ``left_out`` below ``key``, relative to it."""
    return tuple(dotted.removeprefix(f"{key}.") for dotted in left_out if dotted.startswith(f"{key}."))
