"""What a guarded stage's guard decided, as its training node left it beside the final weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.evaluation.guard import GUARD_FILE
from flowpost.core.io import read_json
from flowpost.core.progress import describe_position


def read_guard_record(train_dir: Path) -> dict[str, Any] | None:
    """``final/guard.json`` of a training node's folder (None for a stage without a guard)."""
    path = train_dir / "final" / GUARD_FILE
    return read_json(path, what="guard record") if path.is_file() else None


def guard_outcome(record: dict[str, Any]) -> dict[str, Any]:
    """The short form a node's outputs, the report and the export carry: whether it fired, at which step (and
    ``at_iteration`` for an online trainer), why, and the step of the checkpoint the stage ended with
    (``ended_with``, ``ended_with_iteration``)."""
    fired, good = record["fired"], record["last_good"]
    outcome: dict[str, Any] = {"fired": fired is not None, "checks": len(record["checks"]), "start": record["start"]}
    if fired is not None:
        online = record.get("unit") == "iteration"
        outcome |= {"at": fired["step"], "values": fired["values"], "violations": fired["violations"]}
        outcome |= {"ended_with": good["step"]}
        if online:
            outcome |= {"at_iteration": fired["units"], "ended_with_iteration": good["units"]}
    return outcome


def describe_guard(stage: str, outcome: dict[str, Any]) -> str:
    """One sentence on a stage's guard."""
    if not outcome["fired"]:
        return f"guard of stage {stage!r}: passed all {outcome['checks']} checks"
    return (
        f"guard of stage {stage!r} fired at {describe_position(outcome['at'], outcome.get('at_iteration'))}: "
        f"{'; '.join(outcome['violations'])}. The stage ended with its last good checkpoint, of "
        f"{describe_position(outcome['ended_with'], outcome.get('ended_with_iteration'))}; later nodes use it"
    )
