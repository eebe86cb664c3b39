"""Scheduled retraining: a deployment, served here or run by work-pool workers, that reloads the pipeline file
and runs it on a cron."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any

from prefect import flow

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict
from flowpost.errors import FlowpostError
from flowpost.flows.api import temporary_prefect_server
from flowpost.flows.pipeline import pipeline_flow
from flowpost.tasks.runner import NodeResult
from flowpost.tasks.workspace import checked_workspace

RETRAIN_FLOW = "flowpost-retrain"
NAME_FORBIDDEN = "/%&><"  # characters Prefect's deployment and work-pool names may not hold


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
    except ValueError:
        raise FlowpostError(
            f"invalid cron expression {cron!r}; give five fields (minute hour day month weekday), e.g. '0 3 * * *'",
            where="--cron",
        ) from None


def check_name(name: str, *, where: str) -> None:
    """Reject a deployment or work-pool name Prefect cannot store (empty, or with one of ``/%&><``)."""
    if not name.strip() or any(c in name for c in NAME_FORBIDDEN):
        raise FlowpostError(f"{name!r} is not a usable name; give one without {' '.join(NAME_FORBIDDEN)}", where=where)


def retrain_parameters(
    pipeline_file: Path | None, overrides: list[str], workspace: Path, *, cron: str | None, name: str
) -> dict[str, Any]:
    """Check ``cron``, the deployment ``name``, the workspace and the pipeline now, not at 3 a.m.; the
    parameters of every ``retrain_flow`` run."""
    if cron is not None:
        check_cron(cron)
    check_name(name, where="--name")
    checked_workspace(workspace)
    load_pipeline(pipeline_file, overrides)
    return {
        "pipeline_file": str(pipeline_file.resolve()) if pipeline_file else None,
        "overrides": list(overrides),
        "workspace": str(workspace.resolve()),
    }


def _description(pipeline_file: Path | None, workspace: Path, cron: str | None) -> str:
    when = f"on '{cron}'" if cron else "on demand"
    return f"retrain {pipeline_file or 'the default pipeline'} into {workspace} {when}"


def serve_pipeline(pipeline_file: Path | None, overrides: list[str], workspace: Path, *, cron: str, name: str) -> None:
    """Serve ``retrain_flow`` as deployment ``flowpost-retrain/<name>`` on ``cron`` until interrupted."""
    parameters = retrain_parameters(pipeline_file, overrides, workspace, cron=cron, name=name)
    with temporary_prefect_server():
        retrain_flow.serve(
            name=name,
            cron=cron,
            parameters=parameters,
            tags=["flowpost"],
            description=_description(pipeline_file, workspace, cron),
        )


def ensure_process_pool(pool: str) -> None:
    """Create work pool ``pool`` as a ``process`` pool with Prefect's default job template, unless it exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    work_pool = WorkPoolCreate(
        name=pool, type=ProcessWorker.type, base_job_template=ProcessWorker.get_default_base_job_template()
    )
    with get_client(sync_client=True) as client, suppress(ObjectAlreadyExists):
        client.create_work_pool(work_pool)


def deploy_pipeline(
    pipeline_file: Path | None, overrides: list[str], workspace: Path, *, pool: str, cron: str | None, name: str
) -> str:
    """Register ``retrain_flow`` as deployment ``flowpost-retrain/<name>`` on work pool ``pool`` (created as a
    process pool if missing), scheduled on ``cron`` or run on demand; returns the deployment's full name.

    The entrypoint is the module path, so a worker on any machine where flowpost is installed imports it."""
    from prefect.types.entrypoint import EntrypointType

    check_name(pool, where="--pool")
    parameters = retrain_parameters(pipeline_file, overrides, workspace, cron=cron, name=name)
    ensure_process_pool(pool)
    retrain_flow.to_deployment(
        name=name,
        cron=cron,
        parameters=parameters,
        tags=["flowpost"],
        description=_description(pipeline_file, workspace, cron),
        work_pool_name=pool,
        entrypoint_type=EntrypointType.MODULE_PATH,
    ).apply()
    return f"{RETRAIN_FLOW}/{name}"
