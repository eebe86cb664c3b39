"""An evaluation over a stage's checkpoints (``evaluate.every``): which are scored, and ``curve.json``.

A curve row is ``{"step": <optimizer step>, <each metric>: <its mean over the seeds>}``; the rows run
from the first scored checkpoint to the final weights, one per step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from flowpost.core.checkpoint import step_checkpoints
from flowpost.core.config.schema.stages import StageConfig
from flowpost.core.contracts import Acquisition
from flowpost.core.evaluation.checkpoint_weights import load_checkpoint_weights
from flowpost.core.io import read_json, write_bytes_atomic
from flowpost.core.models.base import ModelAdapter

CURVE_FILE = "curve.json"
Counter = Literal["optimizer_step", "rollout_iteration"]  # the progress counter a stage's budget counts


def budget_counter(stage: StageConfig) -> Counter:
    """What ``train.checkpoint_every`` (and so ``evaluate.every``) counts for ``stage``'s trainer."""
    dataset = stage.arguments().execution_contract.acquisition is Acquisition.DATASET
    return "optimizer_step" if dataset else "rollout_iteration"


def due_checkpoints(checkpoints_dir: Path, *, every: int, counter: Counter, smoke: bool) -> list[Path]:
    """The checkpoints at a multiple of ``every`` budget units, oldest first; all of them under ``smoke``
    (whose cut budgets checkpoint every 2 units)."""
    return [path for path in step_checkpoints(checkpoints_dir) if smoke or _progress(path)[counter] % every == 0]


def _progress(checkpoint: Path) -> dict[str, int]:
    """A checkpoint's progress counters, from its ``state.json`` alone (no weights read)."""
    progress = read_json(checkpoint / "state.json", what="checkpoint state")["trainer"]["progress"]
    return {name: int(value) for name, value in progress.items()}


def checkpoint_curve(
    adapter: ModelAdapter,
    checkpoints: list[Path],
    *,
    weights: str,
    final: dict[str, Any],
    score: Callable[[ModelAdapter], dict[str, float]],
) -> list[dict[str, Any]]:
    """Score each checkpoint's ``weights`` with ``score`` (``adapter`` ends holding the last one's) and add
    the ``final`` row (the final weights' metrics, at their step, replacing a checkpoint of that step)."""
    rows = {int(final["step"]): final}
    for path in checkpoints:
        if _progress(path)["optimizer_step"] in rows:  # the final weights' step: not loaded
            continue
        step = load_checkpoint_weights(adapter, path, weights=weights).optimizer_step
        rows[step] = {"step": step, **score(adapter)}
    return [rows[step] for step in sorted(rows)]


def write_curve(out_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """``out_dir/curve.json``: the rows, a JSON list (what ``dvc plots`` reads), keys in their order
    (step, then the metrics headline first)."""
    write_bytes_atomic(out_dir / CURVE_FILE, (json.dumps(rows, indent=2) + "\n").encode())
    return out_dir / CURVE_FILE


def read_curve(eval_dir: Path) -> list[dict[str, Any]] | None:
    """The curve an ``eval.<stage>`` folder holds, or None without ``evaluate.every``."""
    path = eval_dir / CURVE_FILE
    return read_json(path, what="checkpoint curve") if path.exists() else None
