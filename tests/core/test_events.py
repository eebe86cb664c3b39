"""Stage events: rank 0 appends JSON lines; other ranks write nothing; partial lines are skipped;
typed events round-trip through the log and describe themselves."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from flowpost.core.events import (
    CheckpointEvent,
    DoneEvent,
    Event,
    EventLog,
    ProgressEvent,
    StartEvent,
    parse_event,
    read_events,
    read_typed_events,
    resume_warning,
)
from flowpost.errors import FlowpostError


def test_events_round_trip_and_a_partial_line_is_ignored(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "sub" / "events.jsonl", stage="sft")
    log.write(StartEvent(stage="sft", step=0, budget=3, ranks=1))
    log.write(DoneEvent(stage="sft", step=3, progress={}, ranks=1))
    with (tmp_path / "sub" / "events.jsonl").open("a") as handle:
        handle.write('{"event": "st')
    events = read_events(tmp_path / "sub" / "events.jsonl")
    assert [(e["event"], e["step"], e["stage"]) for e in events] == [("start", 0, "sft"), ("done", 3, "sft")]


def test_a_disabled_log_writes_nothing(tmp_path: Path) -> None:
    EventLog(tmp_path / "sub" / "events.jsonl", stage="sft", enabled=False).write(
        StartEvent(stage="sft", step=0, budget=3, ranks=1)
    )
    assert not (tmp_path / "sub").exists()
    assert read_events(tmp_path / "sub" / "events.jsonl") == []


EVENTS = [
    StartEvent(stage="sft", step=0, budget=4, ranks=1),
    StartEvent(
        stage="sft",
        step=2,
        budget=4,
        resumed_from="ckpt/step-2",
        ranks=1,
        resumed_with_ranks_from=2,
        resumed_with_layout_from="ddp",
    ),
    ProgressEvent(stage="sft", step=1, budget=4, metrics={"loss": 0.5, "lr": 1e-3}),
    CheckpointEvent(stage="sft", step=4, path="ckpt/step-4"),
    DoneEvent(stage="sft", step=4, progress={"optimizer_step": 4}, ranks=1),
]
ONLINE_EVENTS = [  # a trainer whose budget counts rollout iterations, two optimizer steps each
    StartEvent(stage="grpo", step=0, iteration=0, budget=3, ranks=1),
    ProgressEvent(stage="grpo", step=4, iteration=2, budget=3, metrics={"kl": 0.5}),
    CheckpointEvent(stage="grpo", step=4, iteration=2, path="ckpt/step-4"),
    DoneEvent(stage="grpo", step=6, iteration=3, progress={"optimizer_step": 6}, ranks=1),
]


@pytest.mark.parametrize("event", EVENTS + ONLINE_EVENTS, ids=lambda event: f"{event.stage}-{event.kind}")
def test_a_written_event_parses_back_to_itself(tmp_path: Path, event: Event) -> None:
    log = EventLog(tmp_path / "events.jsonl", stage=event.stage)
    log.write(event)
    (record,) = read_events(tmp_path / "events.jsonl")
    assert replace(parse_event(record), time=None) == event
    assert record["time"] > 0


def test_parse_ignores_fields_it_does_not_declare() -> None:
    record = {"event": "checkpoint", "stage": "s", "step": 1, "path": "p", "extra": 1}
    assert parse_event(record) == CheckpointEvent(stage="s", step=1, path="p")


def test_an_iteration_is_recorded_only_by_trainers_that_count_them(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", stage="s")
    log.write(EVENTS[2])
    log.write(ONLINE_EVENTS[1])
    dataset, online = read_events(tmp_path / "events.jsonl")
    assert "iteration" not in dataset and (online["step"], online["iteration"]) == (4, 2)
    assert (EVENTS[2].percent, ONLINE_EVENTS[1].percent) == (25.0, 100.0 * 2 / 3)


def test_a_malformed_or_unknown_record_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"event": "done", "stage": "s", "step": 1}) + "\n")
    with pytest.raises(FlowpostError, match=rf"{path}: 'done' event lacks progress, ranks"):
        read_typed_events(path)
    path.write_text(json.dumps({"event": "eval", "stage": "s", "step": 1}) + "\n")
    with pytest.raises(FlowpostError, match=rf"{path}: unknown event 'eval'"):
        read_typed_events(path)


def test_each_event_describes_itself_in_one_line() -> None:
    assert [event.describe() for event in EVENTS] == [
        "starting at step 0 of 4 steps",
        "resuming from ckpt/step-2 at step 2",
        "step 1/4 loss=0.5 lr=0.001",
        "checkpoint at step 4: ckpt/step-4",
        "done at step 4 on 1 rank(s)",
    ]
    assert [event.describe() for event in ONLINE_EVENTS] == [
        "starting at iteration 0 (step 0) of 3 iterations",
        "iteration 2/3 (step 4) kl=0.5",
        "checkpoint at iteration 2 (step 4): ckpt/step-4",
        "done at iteration 3 (step 6) on 1 rank(s)",
    ]


def test_the_resume_warning_is_given_only_for_a_changed_world_size_or_layout() -> None:
    fresh, changed = EVENTS[0], EVENTS[1]
    assert fresh.resume_warning() is None
    assert changed.resume_warning() == resume_warning(2, "ddp", 1)
    assert "checkpointed with 2 ddp process(es) and resumed with 1:" in changed.resume_warning()
    assert "resumed with 1 fsdp2: " in resume_warning(1, "ddp", 1, "fsdp2")
    assert resume_warning(2, "ddp", 2, "ddp") is None
