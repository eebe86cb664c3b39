"""Stage events: rank 0 appends JSON lines; other ranks write nothing; partial lines are skipped."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.events import EventLog, read_events


def test_events_round_trip_and_a_partial_line_is_ignored(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "sub" / "events.jsonl", stage="sft")
    log.emit("start", step=0)
    log.emit("done", step=3)
    with (tmp_path / "sub" / "events.jsonl").open("a") as handle:
        handle.write('{"event": "st')
    events = read_events(tmp_path / "sub" / "events.jsonl")
    assert [(e["event"], e["step"], e["stage"]) for e in events] == [("start", 0, "sft"), ("done", 3, "sft")]


def test_a_disabled_log_writes_nothing(tmp_path: Path) -> None:
    EventLog(tmp_path / "sub" / "events.jsonl", stage="sft", enabled=False).emit("start", step=0)
    assert not (tmp_path / "sub").exists()
    assert read_events(tmp_path / "sub" / "events.jsonl") == []
