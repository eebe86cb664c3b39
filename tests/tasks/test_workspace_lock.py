"""One run per workspace: a second run or stage is refused naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.errors import FlowpostError
from flowpost.tasks.workspace_lock import LOCK_FILE, workspace_lock

HOLD = """
import signal, sys, time
from flowpost.tasks.workspace_lock import workspace_lock
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (a background job)
with workspace_lock(sys.argv[1], "flowpost run"):
    print("held", flush=True)
    time.sleep(120)
"""


@contextmanager
def _holder(workspace: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``workspace``'s lock until the block ends (or the test kills it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(workspace)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_a_second_run_or_stage_on_a_busy_workspace_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    attempt = tmp_path / "train.sft" / "0123456789ab"
    attempt.mkdir(parents=True)
    (attempt / "_attempt.json").write_text("{}")
    (attempt / "checkpoints").mkdir()
    (attempt / "checkpoints" / "latest").write_text('{"step": 2}')
    with _holder(tmp_path) as holder:
        before = _snapshot(tmp_path)
        busy = f"{tmp_path}: in use by `flowpost run` (pid {holder.pid} on host {socket.gethostname()}, started "
        for command in (["run", "--smoke", "--refresh"], ["run-node", "train.sft", "--smoke", "--refresh"]):
            result = CliRunner().invoke(app, [*command, "-w", str(tmp_path)])
            assert result.exit_code == 1 and isinstance(result.exception, FlowpostError), result.output
            assert str(result.exception).startswith(busy), str(result.exception)
            assert str(result.exception).endswith("; wait for it to end (or stop it), then run again")
        assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_dead_holders_lock_is_taken_over(tmp_path: Path, sig: signal.Signals, caplog) -> None:
    with _holder(tmp_path) as holder:
        holder.send_signal(sig)
        holder.wait(timeout=30)
    with workspace_lock(tmp_path, "flowpost run-node acquire.digits"):
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["command"] == "flowpost run-node acquire.digits" and record["host"] == socket.gethostname()
    if sig is signal.SIGKILL:  # the others release it on the way out; a killed holder still names itself
        assert f"pid {holder.pid}" in caplog.text and "which has ended" in caplog.text


def test_the_holder_may_take_it_again_and_releases_it_at_exit(tmp_path: Path) -> None:
    with workspace_lock(tmp_path, "flowpost run"), workspace_lock(tmp_path, "flowpost flow run"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "flowpost run"
    assert (tmp_path / LOCK_FILE).read_text() == ""
    for _ in range(2):  # stages run one after another, as DVC runs them
        with _holder(tmp_path):
            pass


def test_only_machine_zero_of_a_multi_machine_stage_takes_it(tmp_path: Path, monkeypatch) -> None:
    with _holder(tmp_path):  # machine 0
        monkeypatch.setenv("FLOWPOST_NUM_MACHINES", "2")
        monkeypatch.setenv("FLOWPOST_MACHINE_RANK", "1")
        with workspace_lock(tmp_path, "flowpost run-node train.sft"):
            assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "flowpost run"
