"""The pipeline as a Prefect flow: one task per node, dependencies as ``wait_for``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.events import Event, GuardEvent, ProgressEvent, StartEvent
from flowpost.errors import FlowpostError, TransientError
from flowpost.tasks.cost import cost_rows
from flowpost.tasks.curve import read_curve
from flowpost.tasks.graph import NodeKind
from flowpost.tasks.interrupts import stop_run_on_signals
from flowpost.tasks.runner import NodeResult, PipelineRun
from flowpost.tasks.workspace_lock import workspace_lock

if TYPE_CHECKING:
    from flowpost.core.config.schema import PipelineConfig

HEAVY_KINDS = (NodeKind.TRAIN, NodeKind.EVAL, NodeKind.LATENTS)


def progress_bar(done: int, total: int, width: int = 24) -> str:
    """A text bar such as ``[##########--------------]`` for log lines."""
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def submission_plan(nodes: dict[str, Any]) -> dict[str, list[str]]:
    """Node id -> the nodes its task waits for, in submission order.

    Each node waits for its dependencies; a heavy node (train, eval, latents) also waits for the heavy
    node submitted before it, so at most one heavy node runs at a time while light nodes still
    run concurrently.
    """
    plan: dict[str, list[str]] = {}
    previous_heavy: str | None = None
    for node_id, node in nodes.items():
        waits = list(node.deps)
        if node.kind in HEAVY_KINDS:
            if previous_heavy is not None and previous_heavy not in waits:
                waits.append(previous_heavy)
            previous_heavy = node_id
        plan[node_id] = waits
    return plan


def _artifact_key(node_id: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in node_id.lower())


@task(cache_policy=NO_CACHE, persist_result=False)
def run_node(run: PipelineRun, node_id: str, refresh: bool, resume: bool) -> NodeResult:
    """Execute one node (or reuse its completed folder) and relay training progress.

    A ``FlowpostError`` ends the task in a Failed state carrying the message (no traceback).
    """
    logger = get_run_logger()
    state: dict[str, Any] = {}

    def on_event(event: Event) -> None:
        bar = f"{progress_bar(event.done, event.budget)} " if isinstance(event, ProgressEvent) else ""
        fired = isinstance(event, GuardEvent) and bool(event.violations)
        (logger.warning if fired else logger.info)("%s %s%s", node_id, bar, event.describe())
        if isinstance(event, StartEvent):
            if warning := event.resume_warning():
                logger.warning("%s %s", node_id, warning)
            state["artifact"] = create_progress_artifact(
                progress=event.percent,
                key=f"progress-{_artifact_key(node_id)}",
                description=f"{node_id}: {event.unit}s of {event.budget}",
            )
        elif isinstance(event, ProgressEvent):
            counted = {"step": event.step} | ({} if event.iteration is None else {"iteration": event.iteration})
            state.setdefault("rows", []).append(counted | event.metrics)
            if "artifact" in state:
                update_progress_artifact(state["artifact"], progress=event.percent)

    try:
        result = run.execute(node_id, refresh=refresh, resume=resume, on_event=on_event)
    except FlowpostError as exc:  # a user-fixable failure: report the message, not a traceback
        return Failed(message=str(exc), data=exc)
    logger.info("%s %s in %.1fs -> %s", node_id, result.status, result.seconds, result.path)
    if state.get("rows"):
        create_table_artifact(
            table=metrics_table(state["rows"]),
            key=f"metrics-{_artifact_key(node_id)}",
            description=f"{node_id}: metrics per logged step or iteration",
        )
    curve = read_curve(result.path) if run.nodes[node_id].kind is NodeKind.EVAL else None
    if curve is not None:
        stage = run.nodes[node_id].key
        create_table_artifact(
            table=metrics_table(curve),
            key=f"curve-{_artifact_key(stage)}",
            description=f"{node_id}: metrics per scored checkpoint (evaluate.every)",
        )
    return result


def metrics_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of a step (and iteration) with one column per metric seen (blank where a row did not log it), values
    rounded."""
    counters = [key for key in ("iteration", "step") if any(key in row for row in rows)]
    columns = [*counters, *sorted({key for row in rows for key in row} - set(counters))]
    return [
        {c: (round(row[c], 6) if isinstance(row.get(c), float) else row.get(c, "")) for c in columns} for row in rows
    ]


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a node only when it failed with a ``TransientError`` (a reward server or source that did not answer)."""
    return isinstance(state.result(raise_on_failure=False), TransientError)


@flow(name="flowpost-pipeline", log_prints=True)
def pipeline_flow(
    pipeline: dict[str, Any],
    workspace: str,
    refresh: bool = False,
    resume: bool = True,
    retries: int = 2,
    retry_delay_seconds: float = 10.0,
    log_warnings: bool = True,
) -> list[NodeResult]:
    """Run every node of ``pipeline`` in ``workspace``; light nodes run concurrently, heavy ones in turn.

    The pipeline's warnings (what validates but cannot learn) are logged unless ``log_warnings`` is off, as
    ``flowpost run`` turns it: it printed them when it loaded the file.

    A node that fails transiently is retried ``retries`` times, waiting ``retry_delay_seconds``
    doubled at each retry (a training node resumes from its checkpoints). When a node fails, nodes
    downstream of it do not run and the flow fails with that node's message. The flow holds the
    workspace's lock (``flowpost run`` already does; a scheduled or deployed run takes it here).
    SIGINT or SIGTERM stops the stages and the processes the run started and exits 130 or 143. A
    ``FlowpostError`` fails the flow with its message, without a traceback in the log.
    """
    try:
        with stop_run_on_signals(), workspace_lock(workspace, "flowpost flow run"):
            config = validate_pipeline(pipeline, warnings=None if log_warnings else [])
            return _run_pipeline(config, workspace, refresh, resume, retries, retry_delay_seconds)
    except FlowpostError as exc:
        return Failed(message=str(exc), data=exc)  # type: ignore[return-value]


def _run_pipeline(
    pipeline: PipelineConfig, workspace: str, refresh: bool, resume: bool, retries: int, retry_delay_seconds: float
) -> list[NodeResult]:
    run = PipelineRun(pipeline, workspace)
    futures: dict[str, Any] = {}
    for node_id, waits in submission_plan(run.nodes).items():
        node = run.nodes[node_id]
        tags = ["flowpost", f"flowpost-{node.kind}"] + (["flowpost-heavy"] if node.kind in HEAVY_KINDS else [])
        options = {
            "retries": retries,
            "retry_delay_seconds": [retry_delay_seconds * 2**k for k in range(retries)] if retries else 0,
            "retry_condition_fn": retry_transient,
        }
        futures[node_id] = run_node.with_options(name=node_id, tags=tags, **options).submit(
            run, node_id, refresh, resume, wait_for=[futures[dep] for dep in waits]
        )
    for future in futures.values():
        future.wait()
    failed = [(node_id, f.state) for node_id, f in futures.items() if f.state.is_failed()]
    if failed:
        node_id, state = failed[0]
        error = FlowpostError(f"node {node_id} failed: {state.message}")
        return Failed(message=str(error), data=error)  # type: ignore[return-value]
    results = [future.result() for future in futures.values()]
    report = run.publish_report()
    if report is not None:
        create_markdown_artifact(
            markdown=(Path(report).parent / "report.md").read_text(),
            key=f"{_artifact_key(run.pipeline.name)}-report",
            description="flowpost run report",
        )
        costs = cost_rows(json.loads(Path(report).read_text()))
        if costs:
            create_table_artifact(
                table=costs,
                key=f"{_artifact_key(run.pipeline.name)}-cost",
                description="cost ledger per trained stage: wall seconds per phase, throughput, peak memory",
            )
    return results
