"""JSON-lines events written by rank 0 of a training stage and tailed by the orchestrator.

One frozen dataclass per kind (``start``, ``progress``, ``checkpoint``, ``guard``, ``done``): ``parse`` reads one
from its JSON record, ``describe()`` is the line a reader prints, ``parse_event`` dispatches on kind.
"""

from __future__ import annotations

import dataclasses
import json
import time
from abc import ABC, abstractmethod
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from flowpost.core.progress import describe_position
from flowpost.errors import FlowpostError


def resume_warning(saved_ranks: int, saved_layout: str, ranks: int, layout: str | None = None) -> str | None:
    """What a resume under another world size or layout costs; None when nothing changed.

    ``layout`` None means "unknown, but it differs": the caller saw a change.
    """
    if (saved_ranks, saved_layout) == (ranks, layout):
        return None
    now = f"{ranks} {layout}" if layout else f"{ranks}"
    return (
        f"checkpointed with {saved_ranks} {saved_layout} process(es) and resumed with {now}: the same global "
        "batches, but the numbers are no longer bit-identical to an uninterrupted run"
    )


@dataclass(frozen=True, kw_only=True)
class Event(ABC):
    """Fields every event carries: ``step`` counts optimizer steps, ``iteration`` rollout iterations (online
    trainers only, None otherwise); ``time`` is stamped by the log when written."""

    kind: ClassVar[str]
    stage: str
    step: int
    iteration: int | None = None
    time: float | None = None

    @property
    def position(self) -> str:
        """``step 10``, or ``iteration 5 (step 10)``."""
        return describe_position(self.step, self.iteration)

    @classmethod
    def parse(cls, record: dict[str, Any], *, where: str | None = None) -> Self:
        """The event in ``record`` (one JSON object of the log); fields it does not declare are ignored."""
        if record.get("event") != cls.kind:
            raise FlowpostError(f"expected a {cls.kind!r} event, got {record.get('event')!r}", where=where)
        declared = dataclasses.fields(cls)
        missing = [f.name for f in declared if f.name not in record and f.default is MISSING]
        if missing:
            raise FlowpostError(f"{cls.kind!r} event lacks {', '.join(missing)}: {record}", where=where)
        return cls(**{f.name: record[f.name] for f in declared if f.name in record})

    def payload(self) -> dict[str, Any]:
        """The fields the log records besides ``event``, ``stage`` and ``time``, in order."""
        fields = (f.name for f in dataclasses.fields(self) if f.name not in ("stage", "time"))
        return {name: getattr(self, name) for name in fields if name != "iteration" or self.iteration is not None}

    @abstractmethod
    def describe(self) -> str:
        """The one line a reader prints for this event."""


@dataclass(frozen=True, kw_only=True)
class _Budgeted(Event):
    """An event that knows the stage's budget: ``budget`` iterations when ``iteration`` is set, else steps."""

    budget: int

    @property
    def unit(self) -> str:
        return "step" if self.iteration is None else "iteration"

    @property
    def done(self) -> int:
        """Budget units done."""
        return self.step if self.iteration is None else self.iteration

    @property
    def percent(self) -> float:
        """Share of the stage's budget done, in percent."""
        return 100.0 * self.done / self.budget if self.budget else 100.0


@dataclass(frozen=True, kw_only=True)
class StartEvent(_Budgeted):
    """The stage starts (``resumed_from``: the checkpoint it resumes, if any).

    ``resumed_with_*_from``: the checkpoint's world size and layout, recorded only when they differ
    from this run's.
    """

    kind: ClassVar[str] = "start"
    resumed_from: str | None = None
    ranks: int
    resumed_with_ranks_from: int | None = None
    resumed_with_layout_from: str | None = None
    layout: str | None = None

    def payload(self) -> dict[str, Any]:
        optional = ("resumed_with_ranks_from", "resumed_with_layout_from", "layout")
        return {k: v for k, v in super().payload().items() if k not in optional or v is not None}

    def describe(self) -> str:
        if self.resumed_from:
            return f"resuming from {self.resumed_from} at {self.position}"
        return f"starting at {self.position} of {self.budget} {self.unit}s"

    def resume_warning(self) -> str | None:
        """The warning of a resume under another world size or layout (None otherwise)."""
        if self.resumed_with_ranks_from is None or self.resumed_with_layout_from is None:
            return None
        return resume_warning(self.resumed_with_ranks_from, self.resumed_with_layout_from, self.ranks, self.layout)


@dataclass(frozen=True, kw_only=True)
class ProgressEvent(_Budgeted):
    """A logged budget unit (optimizer step or rollout iteration) and its metrics."""

    kind: ClassVar[str] = "progress"
    metrics: dict[str, float]

    def describe(self) -> str:
        metrics = " ".join(f"{key}={value:.4g}" for key, value in sorted(self.metrics.items()))
        counted = f"{self.unit} {self.done}/{self.budget}" + ("" if self.iteration is None else f" (step {self.step})")
        return f"{counted} {metrics}".rstrip()


@dataclass(frozen=True, kw_only=True)
class CheckpointEvent(Event):
    """A checkpoint was written (its folder is ``step-<step>``)."""

    kind: ClassVar[str] = "checkpoint"
    path: str

    def describe(self) -> str:
        return f"checkpoint at {self.position}: {self.path}"


@dataclass(frozen=True, kw_only=True)
class GuardEvent(Event):
    """A guard check: the guarded values, their start, what they violate; when it fired, ``last_good`` is the
    step of the checkpoint the stage ends with."""

    kind: ClassVar[str] = "guard"
    values: dict[str, float]
    start: dict[str, float]
    violations: list[str]
    last_good: int | None = None

    def describe(self) -> str:
        values = " ".join(f"{key}={value:.4g} (start {self.start[key]:.4g})" for key, value in self.values.items())
        if not self.violations:
            return f"guard at {self.position}: {values} passed"
        return (
            f"guard fired at {self.position}: {'; '.join(self.violations)}; the stage ends with its checkpoint "
            f"of step {self.last_good}"
        )


@dataclass(frozen=True, kw_only=True)
class DoneEvent(Event):
    """The stage reached its budget; ``progress`` is its final ``TrainingProgress`` as a dict."""

    kind: ClassVar[str] = "done"
    progress: dict[str, int]
    ranks: int

    def describe(self) -> str:
        return f"done at {self.position} on {self.ranks} rank(s)"


EVENT_TYPES: dict[str, type[Event]] = {
    kind.kind: kind for kind in (StartEvent, ProgressEvent, CheckpointEvent, GuardEvent, DoneEvent)
}


def parse_event(record: dict[str, Any], *, where: str | None = None) -> Event:
    """The typed event of a JSON record, by its ``event`` field."""
    kind = record.get("event")
    if kind not in EVENT_TYPES:
        raise FlowpostError(f"unknown event {kind!r}; known: {', '.join(EVENT_TYPES)}", where=where)
    return EVENT_TYPES[kind].parse(record, where=where)


class EventLog:
    """Appends one JSON object a line: ``start``, ``step``, ``checkpoint``, ``guard``, ``done``.

    Disabled (writes nothing) on ranks other than 0.
    """

    def __init__(self, path: str | Path, *, stage: str, enabled: bool = True) -> None:
        self.path = Path(path)
        self.stage = stage
        self.enabled = enabled
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: Event) -> None:
        """Append ``event`` as one JSON line, stamped with the log's stage and the current time."""
        if not self.enabled:
            return
        record = {"event": event.kind, "stage": self.stage, **event.payload(), "time": time.time()}
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


def read_typed_events(path: str | Path, *, start: int = 0) -> list[Event]:
    """``read_events(path)[start:]`` as typed events; a malformed record raises naming ``path``."""
    return [parse_event(record, where=str(path)) for record in read_events(path)[start:]]
