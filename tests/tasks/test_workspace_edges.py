"""Workspaces that cannot hold a run, manifests that are not objects, a Prefect server that is down."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.core.config.loading import validate_pipeline
from flowpost.errors import FlowpostError
from flowpost.flows.api import check_prefect_api
from flowpost.tasks.consistency import stage_consistency
from flowpost.tasks.runner import COMPLETE, PipelineRun
from flowpost.tasks.workspace_lock import workspace_lock


@pytest.mark.parametrize("inside", [False, True], ids=["is-a-file", "under-a-file"])
def test_a_workspace_that_is_or_lies_under_a_file_is_refused_by_name(tmp_path: Path, inside: bool) -> None:
    blocker = tmp_path / "ws"
    blocker.write_text("not a folder")
    workspace = blocker / "inner" if inside else blocker
    result = CliRunner().invoke(app, ["plan", "--smoke", "-w", str(workspace)])
    assert result.exit_code == 1
    assert isinstance(result.exception, FlowpostError)
    assert "--workspace" in str(result.exception) and str(workspace) in str(result.exception)
    with pytest.raises(FlowpostError, match="is a file" if not inside else "lies under the file"):
        with workspace_lock(workspace, "flowpost run"):
            pass
    assert blocker.read_text() == "not a folder"


def test_a_manifest_that_is_not_an_object_makes_the_node_run_again(tmp_path: Path, tiny_pipeline) -> None:
    run = PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path)
    folder = run.path("acquire.digits")
    folder.mkdir(parents=True)
    (folder / COMPLETE).write_text(json.dumps([run.fingerprints["acquire.digits"]]))
    assert not run.is_complete("acquire.digits")
    result = CliRunner().invoke(app, ["plan", "--smoke", "-w", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "acquire.digits" in result.output and "run" in result.output


def test_a_prefect_server_that_does_not_answer_is_named_before_a_run() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        with pytest.raises(FlowpostError, match="does not answer") as raised:
            check_prefect_api()
    assert raised.value.where == "PREFECT_API_URL"


def test_check_consistency_before_its_inputs_exist_names_the_smoke_switch(tmp_path: Path, tiny_pipeline) -> None:
    pipeline = validate_pipeline({**tiny_pipeline(), "smoke": False})
    with pytest.raises(FlowpostError, match="--set smoke=true"):
        stage_consistency(pipeline, tmp_path, "sft")
