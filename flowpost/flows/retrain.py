"""Scheduled retraining: a served deployment that reloads the pipeline file and runs it on a cron."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict
from flowpost.errors import FlowpostError
from flowpost.flows.pipeline import pipeline_flow
from flowpost.tasks.runner import NodeResult

RETRAIN_FLOW = "flowpost-retrain"


@flow(name=RETRAIN_FLOW, log_prints=True)
def retrain_flow(pipeline_file: str | None, overrides: list[str], workspace: str) -> list[NodeResult]:
    """Load the pipeline file as it is now and run it; nodes whose fingerprints did not change are cached."""
    config = load_pipeline(pipeline_file, overrides)
    return pipeline_flow(pipeline_to_dict(config), workspace)


def check_cron(cron: str) -> None:
    """Reject a malformed cron expression before anything is served."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError as exc:
        raise FlowpostError(f"invalid cron expression {cron!r} ({exc})", where="--cron") from None


def serve_pipeline(pipeline_file: Path | None, overrides: list[str], workspace: Path, *, cron: str, name: str) -> None:
    """Serve ``retrain_flow`` as deployment ``flowpost-retrain/<name>`` on ``cron`` until interrupted."""
    check_cron(cron)
    load_pipeline(pipeline_file, overrides)  # fail now on a bad file, not at 3 a.m.
    retrain_flow.serve(
        name=name,
        cron=cron,
        parameters={
            "pipeline_file": str(pipeline_file.resolve()) if pipeline_file else None,
            "overrides": list(overrides),
            "workspace": str(workspace.resolve()),
        },
        tags=["flowpost"],
        description=f"retrain {pipeline_file or 'the default pipeline'} into {workspace} on '{cron}'",
    )
