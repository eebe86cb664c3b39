"""Faults around `flowpost run` itself: a workspace on a full disk, a flowpost error raised inside the Prefect
flow, a temporary Prefect server that starts too slowly or outlives a killed run."""

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
from cli_main import flowpost_main
from test_cli_interrupt import _listening, _pipeline_file, _start, _training
from unwritable import fill, small_disk

GONE_WITHIN_SECONDS = 15  # the watchdog polls 4 times a second and gives the server 5 s to stop


def _flowpost_run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`flowpost run ARGS` in ``tmp_path`` on a temporary Prefect server, as a user runs it."""
    environ = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), **env}
    environ.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "flowpost.cli", "run", *args, "--workspace", "ws"]
    return subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600)


def test_a_workspace_on_a_full_disk_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        fill(disk)
        outcome = flowpost_main("run", "--smoke", "--workspace", str(disk / "ws"))
        assert outcome.code == 1, outcome
        assert outcome.stderr == (
            f"error: {disk / 'ws'}: the workspace cannot be written (No space left on device); make it writable or "
            "free space on its disk, or pass another folder with --workspace\n"
        )
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_a_temporary_server_that_does_not_start_in_time_says_how_to_run_a_persistent_one(tmp_path: Path) -> None:
    outcome = _flowpost_run(tmp_path, "--smoke", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    output = outcome.stdout + outcome.stderr
    assert outcome.returncode == 1, output
    assert "Traceback" not in output, output
    assert outcome.stderr.splitlines()[-1] == (
        "error: PREFECT_API_URL: the temporary Prefect server did not start within 1 s (a busy host starts it "
        "slowly); start a persistent one with `prefect server start` and set "
        "PREFECT_API_URL=http://127.0.0.1:4200/api, or raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    )
    assert not (tmp_path / "ws" / "acquire.digits").exists()


def _remote_grpo(tiny_pipeline, url: str) -> dict:  # noqa: ANN001
    config = tiny_pipeline()
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "rewards": [{"name": "remote", "options": {"url": url, "retries": 0}}],  # unpinned: asked at flow start
        "train": {"iterations": 2, "prompts_per_iteration": 2, "group_size": 4},
    }
    return config


@pytest.mark.slow
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:9/score", "http://127.0.0.1:9/score: reward server failed"),
        ("file:///tmp/score", "got scheme 'file'"),
    ],
    ids=["down", "file-url"],
)
def test_a_flowpost_error_at_flow_start_is_one_line_without_a_traceback(
    tmp_path: Path, tiny_pipeline, url: str, why: str
) -> None:
    pipeline = tmp_path / "remote.yaml"
    pipeline.write_text(yaml.safe_dump(_remote_grpo(tiny_pipeline, url), sort_keys=False))
    outcome = _flowpost_run(tmp_path, str(pipeline))
    output = outcome.stdout + outcome.stderr
    assert outcome.returncode == 1, output
    assert "Traceback" not in output and "Encountered exception" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: stages.grpo.rewards.0: cannot read the reward server's")
    assert why in errors[0], errors[0]


@pytest.mark.slow
def test_sigkill_of_flowpost_run_ends_its_temporary_server(tmp_path: Path, long_pipeline) -> None:
    run = _start(tmp_path, _pipeline_file(tmp_path, long_pipeline))
    _, processes = _training(tmp_path, run, checkpointed=False)
    ports = _listening(processes)
    assert ports, "the temporary server listens on a port"
    os.kill(run.pid, signal.SIGKILL)  # the main process only, as the OOM killer does
    run.communicate(timeout=30)
    deadline = time.monotonic() + GONE_WITHIN_SECONDS
    while time.monotonic() < deadline:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        listening = {c.laddr.port for c in psutil.net_connections() if c.status == psutil.CONN_LISTEN}
        if not alive and not ports & listening:
            return
        time.sleep(0.25)
    pytest.fail(f"still running {GONE_WITHIN_SECONDS} s after SIGKILL: {alive}, ports {ports & listening}")
