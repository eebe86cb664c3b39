"""`flowpost serve` registers a deployment with its cron schedule on the Prefect API."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flowpost.errors import FlowpostError


def test_serve_registers_the_deployment_with_its_cron_schedule(prefect_harness, tiny_pipeline, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    from flowpost.flows.retrain import RETRAIN_FLOW, retrain_flow

    pipeline = tmp_path / "tiny.yaml"
    pipeline.write_text(yaml.safe_dump(tiny_pipeline()))
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    command = [sys.executable, "-m", "flowpost.cli", "serve", str(pipeline), "--cron", "0 3 * * *"]
    server = subprocess.Popen(
        [*command, "--workspace", str(tmp_path / "ws"), "--name", "nightly", "--set", "seed=3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deployment = _wait_for_deployment(f"{RETRAIN_FLOW}/nightly", server)
    finally:
        server.terminate()
        output = server.communicate(timeout=60)[0].decode(errors="replace")
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"], output
    assert deployment.parameters == {
        "pipeline_file": str(pipeline.resolve()),
        "overrides": ["seed=3"],
        "workspace": str((tmp_path / "ws").resolve()),
    }
    assert retrain_flow.name == RETRAIN_FLOW


def _wait_for_deployment(name: str, server: subprocess.Popen, timeout: float = 120.0):  # noqa: ANN202
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                assert server.poll() is None, "flowpost serve exited before registering the deployment"
                assert time.monotonic() < deadline, "no deployment registered in time"
                time.sleep(0.5)


def test_a_bad_cron_expression_is_rejected_before_serving() -> None:
    from flowpost.flows.retrain import check_cron

    with pytest.raises(FlowpostError, match="--cron.*invalid cron expression"):
        check_cron("every night")
