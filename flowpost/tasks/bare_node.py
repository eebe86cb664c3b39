"""``flowpost run-node NODE``: one node of a pipeline, run bare (no Prefect), as DVC calls it."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.errors import FlowpostError
from flowpost.tasks.runner import FOLDERS, NodeResult, PipelineRun
from flowpost.tasks.train import EventHandler
from flowpost.tasks.workspace_lock import refuse_if_busy, workspace_lock


def run_bare_node(
    pipeline: PipelineConfig,
    workspace: Path,
    node_id: str,
    *,
    folders: str = "content",
    refresh: bool = False,
    resume: bool = True,
    force: bool = False,
    on_event: EventHandler | None = None,
) -> NodeResult:
    """Run ``node_id`` (its inputs must have completed) holding the workspace's lock; the report node
    also publishes its files. A busy workspace, or a node whose inputs are missing, is refused before the
    lock is taken, so nothing is written."""
    if folders not in FOLDERS:
        raise FlowpostError(f"unknown folders {folders!r}; use {' or '.join(FOLDERS)}", where="--folders")
    refuse_if_busy(workspace)  # a refusal writes nothing, not even the lock file
    run = PipelineRun(pipeline, workspace, folders=folders)  # type: ignore[arg-type]
    run.check_inputs(node_id)
    with workspace_lock(workspace, f"flowpost run-node {node_id}"):
        result = run.execute(node_id, refresh=refresh, resume=resume, force=force, on_event=on_event)
        if node_id == "report":
            run.publish_report()
    return result
