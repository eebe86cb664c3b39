"""Node ``promote``: the promotion gate between a new export and the workspace's promoted one.

``WORKSPACE/promoted.json`` records the promoted export (its folder, the export node's
fingerprint, stage, metrics, when, and which export it replaced). A new export replaces it unless
one of the gate's metrics regresses by more than the tolerance; stages with ``init: previous``
start from it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flowpost.core.config.schema.evaluation import RESULT_FIELDS
from flowpost.core.config.schema.export import PromoteConfig
from flowpost.core.io import atomic_directory, read_json, write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.errors import FlowpostError
from flowpost.tasks.export import EXPORT_MANIFEST

PROMOTED_FILE = "promoted.json"
DECISION_FILE = "promotion.json"
RECORD_KEYS = ("export", "fingerprint", "stage", "metrics")
NONE = "none"  # the source value while nothing is promoted


@dataclass(frozen=True)
class Decision:
    promoted: bool
    reason: str


def decide(gate: PromoteConfig, candidate: dict[str, float], incumbent: dict[str, float] | None) -> Decision:
    """Promote unless a gate metric of ``candidate`` is worse than ``incumbent``'s by more than the tolerance."""
    if incumbent is None:
        return Decision(True, "promoted: nothing was promoted before")
    regressions = [
        text
        for name, direction in gate.directions().items()
        if (text := _regression(name, direction, candidate[name], incumbent[name], gate.tolerance))
    ]
    if regressions:
        return Decision(False, "kept the promoted export: " + "; ".join(regressions))
    compared = "; ".join(f"{name} {candidate[name]:.3f}, promoted {incumbent[name]:.3f}" for name in gate.metrics)
    return Decision(True, f"promoted: no metric regressed ({compared})")


def _regression(name: str, direction: str, new: float, old: float, tolerance: float) -> str | None:
    """``adherence 0.812 < 0.900 (promoted), worse by 0.088`` when ``new`` regressed, else None."""
    if direction == "higher" and new < old - tolerance:
        sign, worse = "<", old - new
    elif direction == "lower" and new > old + tolerance:
        sign, worse = ">", new - old
    else:
        return None
    beyond = f", beyond the tolerance {tolerance:g}" if tolerance else ""
    return f"{name} {new:.3f} {sign} {old:.3f} (promoted), worse by {worse:.3f}{beyond}"


def read_promoted(workspace: Path) -> dict[str, Any] | None:
    """The workspace's promoted record, or None when nothing is promoted."""
    path = workspace / PROMOTED_FILE
    if not path.is_file():
        return None
    record = read_json(path, what="promoted export record")
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise FlowpostError(
            f"the promoted record lacks {', '.join(missing)}; delete it to promote the next export again",
            where=str(path),
        )
    return record


def promoted_fingerprint(record: dict[str, Any] | None) -> str:
    """The promoted export's fingerprint (``none`` while nothing is promoted): what ``init: previous`` reads."""
    return record["fingerprint"] if record is not None else NONE


def judged_against(record: dict[str, Any] | None, candidate: str) -> str:
    """The export the export ``candidate`` (a fingerprint) is compared with: the promoted one or, once
    the candidate itself is promoted, the one it replaced (so a promotion keeps its own decision valid)."""
    if record is not None and record["fingerprint"] == candidate:
        return record.get("replaced") or NONE
    return promoted_fingerprint(record)


def promoted_weights(record: dict[str, Any], workspace: Path) -> Path:
    """The promoted export's folder (a loadable model folder), checked to exist."""
    path = workspace / record["export"]
    if not (path / ADAPTER_FILE).is_file():
        raise FlowpostError(
            f"the promoted export is gone; restore it, or delete {workspace / PROMOTED_FILE} to use the fallback",
            where=str(path),
        )
    return path


def promote_export(
    gate: PromoteConfig,
    *,
    stage: str,
    export_dir: Path,
    fingerprint: str,
    incumbent: dict[str, Any] | None,
    workspace: Path,
    out_dir: Path,
    keep_dir: Path | None = None,
) -> dict[str, Any]:
    """Judge the export in ``export_dir`` against ``incumbent``; when it wins, record it as promoted.

    ``keep_dir`` (for fixed folders, which reuse the export folder) receives a copy of a promoted export,
    which the record then names. Writes ``promotion.json`` to ``out_dir``; returns ``{promoted, reason}``.
    """
    manifest_path = export_dir / EXPORT_MANIFEST
    metrics = _evaluated_metrics(read_json(manifest_path, what="export manifest")["metrics"])
    _metrics(metrics, gate.metrics, where=str(manifest_path), fix="add the exported stage to evaluate.after")
    candidate = {"export": _relative(export_dir, workspace), "fingerprint": fingerprint, "stage": stage}
    already = incumbent is not None and incumbent["fingerprint"] == fingerprint
    if already:
        decision = Decision(True, "already the promoted export")
    else:
        held = None
        if incumbent is not None:
            fix = "delete it to promote the next export without comparing"
            held = _metrics(incumbent["metrics"], gate.metrics, where=str(workspace / PROMOTED_FILE), fix=fix)
        decision = decide(gate, metrics, held)
    if decision.promoted and not already:
        kept = _keep(export_dir, keep_dir / fingerprint[:12]) if keep_dir is not None else export_dir
        record = {
            **candidate,
            "export": _relative(kept, workspace),
            "metrics": metrics,
            "promoted_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "replaced": incumbent["fingerprint"] if incumbent is not None else None,
        }
        write_json_atomic(workspace / PROMOTED_FILE, record)
        if keep_dir is not None:
            for old in keep_dir.iterdir():
                if old != kept:
                    shutil.rmtree(old)
    write_json_atomic(
        out_dir / DECISION_FILE,
        {
            "promoted": decision.promoted,
            "reason": decision.reason,
            "candidate": {**candidate, "metrics": metrics},
            "incumbent": incumbent,
        },
    )
    return {"promoted": decision.promoted, "reason": decision.reason}


def _evaluated_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The metric values of an evaluation's ``metrics.json`` (every number but its bookkeeping fields): what a
    promoted record keeps, so a later gate may compare any of them."""
    return {
        key: float(value)
        for key, value in result.items()
        if key not in RESULT_FIELDS and isinstance(value, int | float) and not isinstance(value, bool)
    }


def _keep(export_dir: Path, kept: Path) -> Path:
    """Copy an export (without the runner's manifests) to ``kept``, atomically."""
    with atomic_directory(kept) as tmp:
        shutil.copytree(export_dir, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_*.json"))
    return kept


def _metrics(source: dict[str, Any], names: Iterable[str], *, where: str, fix: str) -> dict[str, float]:
    """``{name: value}`` for each of ``names`` in ``source``; a missing one is an error naming the file."""
    missing = [name for name in names if not isinstance(source.get(name), int | float)]
    if missing:
        raise FlowpostError(f"no {', '.join(missing)} recorded to compare; {fix}", where=where)
    return {name: float(source[name]) for name in names}


def _relative(path: Path, workspace: Path) -> str:
    """``path`` relative to the workspace when inside it (the record survives moving the workspace)."""
    return str(path.relative_to(workspace)) if path.is_relative_to(workspace) else str(path)
