"""Ctrl-C (SIGINT to the process group) and SIGTERM stop `flowpost run` within seconds, leaving nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from flowpost.core.events import read_events

STOP_SECONDS = 20  # the stage checkpoints at its next step; the temporary server gets 5 s
KILL_AFTER_SECONDS = 10  # a rank that does not stop on SIGTERM is killed this long after it


def _pipeline_file(tmp_path: Path, config: dict) -> Path:
    pipeline = tmp_path / "long.yaml"
    pipeline.write_text(yaml.safe_dump(config))
    return pipeline


def _start(tmp_path: Path, pipeline: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)  # a temporary server, as a user gets
    return subprocess.Popen(
        [sys.executable, "-m", "flowpost.cli", "run", str(pipeline), "--workspace", "ws"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )


def _training(
    tmp_path: Path, run: subprocess.Popen[str], *, checkpointed: bool, seen: int = 0
) -> tuple[Path, list[psutil.Process]]:
    """Wait until train.sft steps (and has a checkpoint) after its first ``seen`` events; return its events
    file and the run's processes."""
    deadline = time.monotonic() + 300
    while True:
        assert run.poll() is None, run.communicate()[0]
        assert time.monotonic() < deadline, "train.sft did not start"
        events = list((tmp_path / "ws" / "train.sft").glob("*/events.jsonl"))
        kinds = [e["event"] for e in read_events(events[0])[seen:]] if events else []
        if "progress" in kinds[kinds.index("start") if "start" in kinds else len(kinds) :] and (
            "checkpoint" in kinds or not checkpointed
        ):
            return events[0], psutil.Process(run.pid).children(recursive=True)
        time.sleep(0.2)


def _listening(processes: list[psutil.Process]) -> set[int]:
    ports = set()
    for process in processes:
        try:
            ports |= {c.laddr.port for c in process.net_connections() if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return ports


def _stopped(
    run: subprocess.Popen[str], processes: list[psutil.Process], ports: set[int], *, within: float = STOP_SECONDS
) -> tuple[int, float, str]:
    started = time.monotonic()
    output = run.communicate(timeout=within)[0]
    seconds = time.monotonic() - started
    assert not [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], output
    still = {c.laddr.port for c in psutil.net_connections() if c.status == psutil.CONN_LISTEN}
    assert not ports & still, output
    assert "Traceback" not in output and "--- Logging error ---" not in output, output
    return run.returncode, seconds, output


@pytest.mark.slow
def test_ctrl_c_then_sigterm_stop_the_run_and_the_stage_resumes(tmp_path: Path, long_pipeline) -> None:
    pipeline = _pipeline_file(tmp_path, long_pipeline)
    run = _start(tmp_path, pipeline)
    events, processes = _training(tmp_path, run, checkpointed=True)
    ports = _listening(processes)
    assert ports, "no temporary Prefect server found"
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, twice
    time.sleep(0.2)
    os.killpg(run.pid, signal.SIGINT)
    code, seconds, output = _stopped(run, processes, ports)
    assert code == 130, output
    assert "SIGINT received" in output and "run it again to resume" in output
    print(f"SIGINT: stopped in {seconds:.1f} s")

    before = [e for e in read_events(events) if e["event"] == "checkpoint"][-1]["step"]
    again = _start(tmp_path, pipeline)
    _, processes = _training(tmp_path, again, checkpointed=False, seen=len(read_events(events)))
    start = [e for e in read_events(events) if e["event"] == "start"][-1]
    assert start["resumed_from"] is not None and start["step"] >= before
    ports = _listening(processes)
    again.send_signal(signal.SIGTERM)  # what timeout, systemd and Kubernetes send: to the main process only
    code, seconds, output = _stopped(again, processes, ports)
    assert code == 143, output
    print(f"SIGTERM: stopped in {seconds:.1f} s")


@pytest.mark.slow
def test_a_rank_that_ignores_sigterm_is_killed_and_its_last_checkpoint_resumes(tmp_path: Path, long_pipeline) -> None:
    pipeline = _pipeline_file(tmp_path, long_pipeline)
    run = _start(tmp_path, pipeline)
    events, processes = _training(tmp_path, run, checkpointed=True)
    ranks = [p for p in processes if "flowpost.stage" in " ".join(p.cmdline())]
    assert ranks, [p.cmdline() for p in processes]
    for rank in ranks:  # stopped: its SIGTERM stays pending, as for a rank stuck in a native call
        rank.suspend()
    ports = _listening(processes)
    run.send_signal(signal.SIGTERM)
    code, seconds, output = _stopped(run, processes, ports, within=STOP_SECONDS + KILL_AFTER_SECONDS)
    assert code == 143, output
    assert seconds >= KILL_AFTER_SECONDS, f"the stopped rank cannot have ended on SIGTERM after {seconds:.1f} s"
    assert all(not r.is_running() or r.status() == psutil.STATUS_ZOMBIE for r in ranks)
    print(f"stuck rank: killed, run stopped in {seconds:.1f} s")

    checkpoints = [e["step"] for e in read_events(events) if e["event"] == "checkpoint"]
    again = _start(tmp_path, pipeline)
    _, processes = _training(tmp_path, again, checkpointed=False, seen=len(read_events(events)))
    start = [e for e in read_events(events) if e["event"] == "start"][-1]
    # the last checkpoint recorded (or one saved just before the rank stopped, its event unwritten)
    assert start["resumed_from"] is not None and start["step"] >= checkpoints[-1] and start["step"] % 5 == 0
    again.send_signal(signal.SIGTERM)
    code, _, output = _stopped(again, processes, _listening(processes))
    assert code == 143, output
