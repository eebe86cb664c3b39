"""`flowpost deploy` registers a deployment on a Prefect work pool; `prefect worker start` runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from flowpost.errors import FlowpostError

PREFECT = str(Path(sys.executable).with_name("prefect"))


def _env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}


def _flowpost(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "flowpost.cli", *args]
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=180)


def _pipeline_file(tmp_path: Path, config: dict) -> Path:
    pipeline = tmp_path / "tiny.yaml"
    pipeline.write_text(yaml.safe_dump(config))
    return pipeline


def test_deploy_creates_a_process_pool_and_a_scheduled_deployment(
    prefect_harness, tiny_pipeline, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    pipeline = _pipeline_file(tmp_path, tiny_pipeline())
    args = [str(pipeline), "--pool", "deploy-pool", "--workspace", str(tmp_path / "ws"), "--name", "pooled"]
    done = _flowpost("deploy", *args, "--cron", "0 3 * * *", "--set", "seed=3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "prefect worker start --pool deploy-pool" in done.stdout
    assert "prefect deployment run flowpost-retrain/pooled" in done.stdout
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool("deploy-pool")
        deployment = client.read_deployment_by_name("flowpost-retrain/pooled")
    assert pool.type == "process"
    assert deployment.work_pool_name == "deploy-pool"
    assert deployment.entrypoint == "flowpost.flows.retrain.retrain_flow"
    assert deployment.tags == ["flowpost"]
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    assert deployment.parameters == {
        "pipeline_file": str(pipeline.resolve()),
        "overrides": ["seed=3"],
        "workspace": str((tmp_path / "ws").resolve()),
    }

    again = _flowpost("deploy", *args)  # the pool exists; without --cron the deployment runs on demand
    assert again.returncode == 0, again.stdout + again.stderr
    with get_client(sync_client=True) as client:
        assert client.read_deployment_by_name("flowpost-retrain/pooled").schedules == []


def test_deploy_rejects_a_bad_cron_and_a_missing_pipeline_before_registering(tmp_path: Path) -> None:
    from flowpost.flows.retrain import deploy_pipeline

    with pytest.raises(FlowpostError, match="--cron.*invalid cron expression"):
        deploy_pipeline(None, [], tmp_path, pool="p", cron="every night", name="n")
    with pytest.raises(FlowpostError, match="pipeline file not found"):
        deploy_pipeline(tmp_path / "missing.yaml", [], tmp_path, pool="p", cron=None, name="n")


@pytest.mark.slow
def test_a_worker_on_the_pool_runs_the_deployed_pipeline(prefect_harness, tiny_pipeline, tmp_path: Path) -> None:
    from prefect.deployments import run_deployment

    from flowpost.core.config.loading import load_pipeline
    from flowpost.flows.retrain import deploy_pipeline
    from flowpost.tasks.runner import PipelineRun

    workspace = tmp_path / "ws"
    pipeline = _pipeline_file(tmp_path, tiny_pipeline())
    deployment = deploy_pipeline(pipeline, [], workspace, pool="worker-pool", cron=None, name="on-demand")
    flow_run = run_deployment(deployment, timeout=0)
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "worker-pool", "--run-once"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        state = _wait_for_final_state(flow_run.id, timeout=300.0)
        worker.wait(timeout=60)
    finally:
        worker.terminate()
        output = worker.communicate(timeout=60)[0].decode(errors="replace")
    assert state.is_completed(), f"{state}\n{output}"
    run = PipelineRun(load_pipeline(pipeline, []), workspace)
    assert [node for node in run.nodes if not run.is_complete(node)] == []
    assert json.loads((workspace / "metrics.json").read_text())["sft"]["step"] == 3


def _wait_for_final_state(flow_run_id, timeout: float):  # noqa: ANN001, ANN202
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(flow_run_id).state
            if state is not None and state.is_final():
                return state
            assert time.monotonic() < deadline, f"flow run still {state} after {timeout} s"
            time.sleep(1.0)


def _training_events(workspace: Path, *, after: int, deadline: float) -> Path:
    """The events file of ``train.sft`` once it has a checkpoint event after its first ``after`` events."""
    from flowpost.core.events import read_events

    while True:
        assert time.monotonic() < deadline, "train.sft did not checkpoint"
        found = list((workspace / "train.sft").glob("*/events.jsonl"))
        if found and "checkpoint" in [e["event"] for e in read_events(found[0])[after:]]:
            return found[0]
        time.sleep(0.5)


def _survivors(processes: list[psutil.Process], within: float) -> list[psutil.Process]:
    """Those of ``processes`` still running (not zombies) after ``within`` seconds at most."""
    _, alive = psutil.wait_procs(processes, timeout=within)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_cancelling_or_interrupting_a_deployed_run_stops_its_stage_which_then_resumes(
    prefect_harness, long_pipeline, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    from flowpost.core.events import read_events
    from flowpost.flows.retrain import deploy_pipeline
    from flowpost.tasks.workspace_lock import workspace_lock

    workspace = tmp_path / "ws"
    deployment = deploy_pipeline(
        _pipeline_file(tmp_path, long_pipeline), [], workspace, pool="signal-pool", cron=None, name="signals"
    )
    log = (tmp_path / "worker.log").open("wb")  # a file, not a pipe: the flow runs log every step through it
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "signal-pool"],
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # cancelled in Prefect (what the UI's Cancel does): the worker sends the flow run SIGTERM
        cancelled = run_deployment(deployment, timeout=0)
        events = _training_events(workspace, after=0, deadline=time.monotonic() + 300)
        processes = psutil.Process(worker.pid).children(recursive=True)
        ranks = [p for p in processes if "flowpost.stage" in " ".join(p.cmdline())]
        assert ranks, [p.cmdline() for p in processes]
        done = subprocess.run([PREFECT, "flow-run", "cancel", str(cancelled.id)], env=_env(), capture_output=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not _survivors(ranks, within=60), "the stage's ranks outlived the cancelled flow run"
        state = _wait_for_final_state(cancelled.id, timeout=60.0)
        assert state.is_cancelled(), state
        stopped = read_events(events)
        assert stopped[-1]["event"] == "checkpoint", stopped[-1]  # stopped at a step, not killed
        with workspace_lock(workspace, "test"):  # the lock went with the flow run
            pass

        # SIGINT straight to the flow run's process (a Ctrl-C where it runs in the foreground)
        interrupted = run_deployment(deployment, timeout=0)
        _training_events(workspace, after=len(stopped), deadline=time.monotonic() + 300)
        start = [e for e in read_events(events) if e["event"] == "start"][-1]
        assert start["resumed_from"] is not None and start["step"] == stopped[-1]["step"], start
        processes = psutil.Process(worker.pid).children(recursive=True)
        ranks = [p for p in processes if "flowpost.stage" in " ".join(p.cmdline())]
        flow_process = next(r.parent() for r in ranks)
        flow_process.send_signal(signal.SIGINT)
        assert not _survivors([flow_process, *ranks], within=30), (
            "the interrupted flow run or its stage is still running"
        )
        assert read_events(events)[-1]["event"] == "checkpoint"
        state = _wait_for_final_state(interrupted.id, timeout=60.0)
        assert not state.is_completed(), state
        print(f"cancelled: {cancelled.id}; interrupted: {state.type.value}")
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:  # the worker's own shutdown is Prefect's; its session must not outlive us
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=60)
        log.close()
