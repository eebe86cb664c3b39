"""A completed tiny-pipeline workspace, built once per session and shared by the runner tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.runner import PipelineRun


@pytest.fixture(scope="session")
def completed_workspace(tmp_path_factory: pytest.TempPathFactory, tiny_pipeline) -> tuple[Path, dict[str, str]]:
    """The workspace after every node ran once, and each node's status on that run (all ``ran``)."""
    workspace = tmp_path_factory.mktemp("workspace")
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    statuses = {node_id: run.execute(node_id).status for node_id in run.nodes}
    run.publish_report()
    return workspace, statuses
