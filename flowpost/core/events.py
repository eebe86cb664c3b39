"""JSON-lines events written by rank 0 of a training stage and tailed by the orchestrator."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class EventLog:
    """Appends one JSON object a line: ``start``, ``step``, ``checkpoint``, ``done``.

    Disabled (writes nothing) on ranks other than 0.
    """

    def __init__(self, path: str | Path, *, stage: str, enabled: bool = True) -> None:
        self.path = Path(path)
        self.stage = stage
        self.enabled = enabled
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"event": event, "stage": self.stage, **fields, "time": time.time()}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record, default=float) + "\n")
            handle.flush()


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """All complete events in ``path`` (a trailing partial line is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
