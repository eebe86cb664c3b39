"""``flowpost check-consistency``: replay one rollout of a coupled stage in a real workspace."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.diagnostics import check_consistency
from flowpost.errors import FlowpostError
from flowpost.stage import build_trainer
from flowpost.tasks.runner import PipelineRun


def stage_consistency(pipeline: PipelineConfig, workspace: Path, stage: str) -> dict[str, Any]:
    """``check_consistency`` on stage ``stage``, built from the workspace's completed inputs."""
    run = PipelineRun(pipeline, workspace)
    node = run.node(f"train.{stage}")
    missing = [dep for dep in node.deps if not run.is_complete(dep)]
    if missing:
        smoke_hint = "" if pipeline.smoke else "; after `flowpost run --smoke`, pass `--set smoke=true` here too"
        raise FlowpostError(
            f"run {', '.join(missing)} first (flowpost run-node NODE){smoke_hint}", where=str(workspace)
        )
    with tempfile.TemporaryDirectory() as scratch:
        return check_consistency(build_trainer(run.train_spec(stage, Path(scratch), resume=False)))
