"""What a run would do: which nodes are cached, which would run, and why they are stale or damaged."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowpost.core.io import read_json_object
from flowpost.errors import FlowpostError
from flowpost.tasks.graph import NodeKind
from flowpost.tasks.runner import COMPLETE, PipelineRun

MAX_CHANGES = 4  # config differences named per node; the rest are counted


@dataclass(frozen=True)
class PlannedNode:
    node: str
    status: str  # "cached" | "run" | "damaged" (completed, but a file it hands on changed: a run rebuilds it)
    reason: str


def plan_run(run: PipelineRun, *, refresh: bool = False) -> list[PlannedNode]:
    """Each node of ``run`` in execution order, ``cached``, ``damaged`` or ``run`` with the reason."""
    planned: list[PlannedNode] = []
    for node_id in run.nodes:
        if run.is_complete(node_id) and not refresh:
            problem = run.damage(node_id)
            if problem is None:
                planned.append(PlannedNode(node_id, "cached", f"result {run.fingerprints[node_id][:12]}"))
            else:
                planned.append(PlannedNode(node_id, "damaged", f"{problem} since it completed; a run rebuilds it"))
        elif refresh:
            planned.append(PlannedNode(node_id, "run", "--refresh"))
        else:
            planned.append(PlannedNode(node_id, "run", _why_stale(run, node_id)))
    return planned


def _why_stale(run: PipelineRun, node_id: str) -> str:
    """Compare the node's inputs with those of its most recent completed result in the workspace."""
    folder = run.path(node_id)
    resumable = folder.is_dir() and run.nodes[node_id].kind is NodeKind.TRAIN
    partial = " (an interrupted attempt will resume)" if resumable else ""
    previous = _latest_completed(folder.parent)
    if previous is None:
        return "no earlier result" + partial
    before: dict[str, Any] = previous.get("inputs") or {}
    if not before:
        return f"earlier result {previous['fingerprint'][:12]} predates recorded inputs" + partial
    now = run.inputs[node_id]
    reasons = [f"{dep} changed" for dep, value in now["deps"].items() if before.get("deps", {}).get(dep) != value]
    sources = now.get("sources", {})
    earlier = before.get("sources", {})
    reasons += [
        f"{name} changed ({str(earlier.get(name))[:12]} -> {str(value)[:12]})"
        for name, value in sources.items()
        if earlier.get(name) != value
    ]
    changes = _differences(before.get("config", {}), now["config"])
    if changes:
        shown = changes[:MAX_CHANGES] + ([f"{len(changes) - MAX_CHANGES} more"] if len(changes) > MAX_CHANGES else [])
        reasons.append("config " + "; ".join(shown))
    if before.get("code") != now["code"]:
        reasons.append("flowpost code or library versions changed")
    return (", ".join(reasons) or "inputs differ") + partial


def _latest_completed(node_dir: Path) -> dict[str, Any] | None:
    manifests = [folder / COMPLETE for folder in node_dir.glob("*") if (folder / COMPLETE).is_file()]
    if not manifests:
        return None
    newest = max(manifests, key=lambda m: m.stat().st_mtime)
    try:
        return read_json_object(newest, what="completion manifest")
    except FlowpostError:
        return None


def _differences(before: Any, now: Any, path: str = "") -> list[str]:
    """``path: old -> new`` for every leaf that differs between two JSON-like values."""
    if isinstance(before, dict) and isinstance(now, dict):
        changes: list[str] = []
        for key in sorted(set(before) | set(now), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in now:
                changes.append(f"{sub} removed")
            elif key not in before:
                changes.append(f"{sub} added")
            else:
                changes += _differences(before[key], now[key], sub)
        return changes
    return [] if before == now else [f"{path or 'value'}: {before!r} -> {now!r}"]
