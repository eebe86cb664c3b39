"""How the orchestrator starts a stage process and reads its outcome (no training)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowpost.core.events import Event
from flowpost.core.trainers.spec import PARENT_PID_ENV, StageSpec
from flowpost.errors import FlowpostError
from flowpost.stage import PARENT_GONE
from flowpost.tasks.train import run_training


def _done(step: int) -> dict:
    return {"event": "done", "stage": "s", "step": step, "progress": {}, "ranks": 1}


def _fake_python(tmp_path: Path, *, emit_done: bool) -> Path:
    """Stands in for the interpreter: records its environment, optionally emits a 'done' event."""
    script = tmp_path / "fake-python"
    done = f"""printf '{json.dumps(_done(7))}\\n' >> "$dir/events.jsonl"\n"""
    script.write_text(
        '#!/bin/sh\ndir=$(dirname "$3")\nenv > "$dir/env.txt"\n' + (done if emit_done else "") + "exit 0\n"
    )
    script.chmod(0o755)
    return script


def _spec(out: Path, num_processes: int = 1, hang_timeout: float | None = None) -> StageSpec:
    launch = {"num_processes": num_processes, "hang_timeout": hang_timeout}
    return StageSpec(stage="s", seed=0, config={"launch": launch}, output_dir=str(out))


def _stale_events(out: Path) -> None:
    out.mkdir(parents=True)
    (out / "events.jsonl").write_text(json.dumps(_done(3)) + "\n")


def test_a_done_event_from_an_earlier_attempt_does_not_count(tmp_path, monkeypatch) -> None:
    out = tmp_path / "stage"
    _stale_events(out)
    monkeypatch.setattr(sys, "executable", str(_fake_python(tmp_path, emit_done=False)))
    with pytest.raises(FlowpostError, match="without a 'done' event"):
        run_training(_spec(out))


def test_the_done_event_of_this_attempt_is_returned(tmp_path, monkeypatch) -> None:
    out = tmp_path / "stage"
    _stale_events(out)
    monkeypatch.setattr(sys, "executable", str(_fake_python(tmp_path, emit_done=True)))
    assert run_training(_spec(out)).step == 7


def test_the_stage_gets_the_parent_pid_and_a_thread_share(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(sys, "executable", str(_fake_python(tmp_path, emit_done=True)))
    popen = subprocess.Popen
    seen: dict = {}

    def recording_popen(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.update(kwargs)
        return popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    run_training(_spec(tmp_path / "stage", num_processes=2))
    env = dict(line.split("=", 1) for line in (tmp_path / "stage" / "env.txt").read_text().splitlines() if "=" in line)
    assert env[PARENT_PID_ENV] == str(os.getpid())
    assert env["OMP_NUM_THREADS"] == "4"
    assert seen["start_new_session"] is True and seen.get("preexec_fn") is None


def test_a_stage_without_events_for_the_hang_timeout_is_killed_as_hung(tmp_path, monkeypatch) -> None:
    script = tmp_path / "hanging-python"
    script.write_text(
        '#!/bin/sh\ndir=$(dirname "$3")\n'
        'printf \'{"event": "start", "stage": "s", "step": 0, "budget": 1, "ranks": 1}\\n\' >> "$dir/events.jsonl"\n'
        'sleep 60 &\necho $! > "$dir/child.pid"\nwait\n'
    )
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    seen: list[Event] = []
    with pytest.raises(FlowpostError, match="killed as hung") as info:
        run_training(_spec(tmp_path / "stage", hang_timeout=1.5), on_event=seen.append)
    assert "launch.hang_timeout" in str(info.value)
    assert [event.kind for event in seen] == ["start"]
    child = (tmp_path / "stage" / "child.pid").read_text().strip()
    status = Path("/proc", child, "status")  # the whole process group is gone, grandchildren included
    assert not status.exists() or "State:\tZ" in status.read_text()


def _launch(spec_path: Path, parent_pid: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    if parent_pid is not None:
        env[PARENT_PID_ENV] = parent_pid
    return subprocess.run(
        [sys.executable, "-m", "flowpost.stage", str(spec_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_stage_whose_orchestrator_is_gone_does_not_start(tmp_path) -> None:
    missing = tmp_path / "missing.json"
    orphan = _launch(missing, parent_pid="1" if os.getpid() != 1 else "2")
    assert orphan.returncode == PARENT_GONE and "orchestrating process has exited" in orphan.stderr
    followed = _launch(missing, parent_pid=str(os.getpid()))
    assert followed.returncode == 1 and "stage spec not found" in followed.stderr
    by_hand = _launch(missing, parent_pid=None)
    assert by_hand.returncode == 1
