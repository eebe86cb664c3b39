"""The ``flowpost`` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.events import Event

app = typer.Typer(
    help="Post-train flow-matching generators from a pipeline file.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
config_app = typer.Typer(help="Inspect pipeline configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
dvc_app = typer.Typer(help="Run the pipeline with DVC.", no_args_is_help=True)
app.add_typer(dvc_app, name="dvc")

PipelineArg = Annotated[Path | None, typer.Argument(help="pipeline YAML (default: the embedded digits pipeline)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="dotted override, e.g. stages.sft.train.lr=1e-4")]
WorkspaceOpt = Annotated[Path, typer.Option("--workspace", "-w", help="folder for every output of the pipeline")]
SmokeOpt = Annotated[bool, typer.Option("--smoke", help="cut every budget to a few steps")]
MachinesOpt = Annotated[int | None, typer.Option("--num-machines", min=1, help="machines of multi-process stages")]
MachineRankOpt = Annotated[int | None, typer.Option("--machine-rank", min=0, help="this machine's rank (0: main)")]
MainIpOpt = Annotated[str | None, typer.Option("--main-process-ip", help="address of machine 0")]
MainPortOpt = Annotated[
    int | None, typer.Option("--main-process-port", min=1, max=65535, help="rendezvous port on machine 0")
]


def _load(  # noqa: ANN202
    pipeline: Path | None, overrides: list[str] | None, *, smoke: bool = False, warnings: list[str] | None = None
):
    from flowpost.core.config.loading import default_pipeline_path, load_pipeline
    from flowpost.tasks.prompt_metadata import prompt_metadata_problems

    extra = ["smoke=true"] if smoke else []
    config = load_pipeline(pipeline, [*(overrides or []), *extra], warnings=warnings)
    if problems := prompt_metadata_problems(config):
        raise FlowpostError(
            "invalid configuration:\n  " + "\n  ".join(problems), where=str(pipeline or default_pipeline_path())
        )
    return config


@app.command()
def run(
    pipeline: PipelineArg = None,
    workspace: WorkspaceOpt = Path("workspace"),
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="rerun nodes even when a result exists")] = False,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="continue killed stages")] = True,
    retries: Annotated[int, typer.Option("--retries", min=0, help="retries of a transiently failing node")] = 2,
    retry_delay: Annotated[float, typer.Option("--retry-delay", min=0, help="seconds before the first retry")] = 10.0,
    num_machines: MachinesOpt = None,
    machine_rank: MachineRankOpt = None,
    main_process_ip: MainIpOpt = None,
    main_process_port: MainPortOpt = None,
) -> None:
    """Run the pipeline as a Prefect flow; print which nodes ran and which were cached."""
    from rich.console import Console
    from rich.table import Table

    from flowpost.core.config.loading import pipeline_to_dict
    from flowpost.core.io import check_writable_workspace
    from flowpost.core.process_group import export_topology
    from flowpost.flows.api import check_prefect_api, temporary_prefect_server
    from flowpost.tasks.guard_record import describe_guard
    from flowpost.tasks.interrupts import stop_run_on_signals
    from flowpost.tasks.workspace import checked_workspace
    from flowpost.tasks.workspace_lock import workspace_lock

    config = _load(pipeline, set_, smoke=smoke)
    export_topology(num_machines, machine_rank, main_process_ip, main_process_port)
    check_writable_workspace(checked_workspace(workspace))
    _quiet_prefect_defaults()
    # the lock is taken before a temporary Prefect server starts; a signal stops that server too
    check_prefect_api()
    with stop_run_on_signals(), workspace_lock(workspace, "flowpost run"), temporary_prefect_server():
        from flowpost.flows.pipeline import pipeline_flow

        results = pipeline_flow(
            pipeline_to_dict(config),
            str(workspace),
            refresh=refresh,
            resume=resume,
            retries=retries,
            retry_delay_seconds=retry_delay,
            log_warnings=False,
        )
    table = Table(title=f"pipeline {config.name} in {workspace}")
    for column in ("node", "status", "seconds"):
        table.add_column(column)
    table.add_column("folder", overflow="fold")
    for result in results:
        table.add_row(result.node, result.status, f"{result.seconds:.1f}", str(result.path))
    console = Console()
    console.print(table)
    for result in results:
        guard = result.outputs.get("guard")
        if guard is not None and guard["fired"]:
            console.print(f"[bold yellow]warning:[/] {describe_guard(result.node.removeprefix('train.'), guard)}")
    metrics = workspace / "metrics.json"
    if metrics.exists():
        console.print(f"metrics: {metrics}\n{metrics.read_text()}")


@app.command()
def serve(
    pipeline: PipelineArg = None,
    cron: Annotated[str, typer.Option("--cron", help='schedule, e.g. "0 3 * * *" (03:00 daily)')] = "0 3 * * *",
    workspace: WorkspaceOpt = Path("workspace"),
    set_: SetOpt = None,
    name: Annotated[str, typer.Option("--name", help="deployment name")] = "scheduled",
) -> None:
    """Serve the pipeline as a Prefect deployment that reruns it on a cron schedule (Ctrl-C stops)."""
    _quiet_prefect_defaults()
    from flowpost.flows.retrain import serve_pipeline

    serve_pipeline(pipeline, list(set_ or []), workspace, cron=cron, name=name)


@app.command()
def deploy(
    pool: Annotated[str, typer.Option("--pool", help="Prefect work pool (created as a process pool if missing)")],
    pipeline: PipelineArg = None,
    cron: Annotated[
        str | None, typer.Option("--cron", help='schedule, e.g. "0 3 * * *" (default: none, run on demand)')
    ] = None,
    workspace: WorkspaceOpt = Path("workspace"),
    set_: SetOpt = None,
    name: Annotated[str, typer.Option("--name", help="deployment name")] = "scheduled",
) -> None:
    """Register the pipeline as a deployment on a Prefect work pool, whose workers run it, and exit."""
    import shlex

    _quiet_prefect_defaults()
    from prefect.settings import PREFECT_API_URL

    from flowpost.flows.retrain import deploy_pipeline

    deployment = deploy_pipeline(pipeline, list(set_ or []), workspace, pool=pool, cron=cron, name=name)
    when = f"on '{cron}'" if cron else "without a schedule"
    typer.echo(f"deployment {deployment} on work pool {pool} {when}")
    if not PREFECT_API_URL.value():
        typer.echo("note: PREFECT_API_URL is not set, so workers on other machines cannot see this deployment")
    typer.echo(f"start workers where flowpost is installed: prefect worker start --pool {shlex.quote(pool)}")
    typer.echo(f"run it now: prefect deployment run {shlex.quote(deployment)}")


@app.command()
def plan(
    pipeline: PipelineArg = None,
    workspace: WorkspaceOpt = Path("workspace"),
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="plan as if every node reruns")] = False,
    gpu_memory: Annotated[
        float | None,
        typer.Option("--gpu-memory", min=1, help="GiB per GPU to check the estimates against (default: this GPU's)"),
    ] = None,
) -> None:
    """Print which nodes a run would reuse and which it would run (and why), without running anything; then,
    for stages of a real family, the estimated memory per GPU (from the pipeline's configs, no weights read)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from flowpost.tasks.plan import plan_run
    from flowpost.tasks.preflight import COLUMNS, cells, over_budget, stage_memory, visible_gpu_memory
    from flowpost.tasks.runner import PipelineRun

    warnings: list[str] = []
    config = _load(pipeline, set_, smoke=smoke, warnings=warnings)
    console = Console(width=160)
    for warning in warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    table = Table(title=f"plan of pipeline {config.name} in {workspace}")
    table.add_column("node")
    table.add_column("status")
    table.add_column("why", overflow="fold")
    for row in plan_run(PipelineRun(config, workspace), refresh=refresh):
        table.add_row(row.node, row.status, row.reason)
    console.print(table)
    memory = stage_memory(config)
    if not memory:
        return
    estimates = Table(title="estimated memory per GPU (GiB; an estimate from the configs, not a measurement)")
    for column in COLUMNS:
        estimates.add_column(column, overflow="fold")
    for row in memory:
        estimates.add_row(*cells(row))
    console.print(estimates)
    for warning in over_budget(memory, gpu_memory if gpu_memory is not None else visible_gpu_memory()):
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


@app.command("run-node")
def run_node(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="node id, e.g. train.sft")],
    pipeline: Annotated[Path | None, typer.Option("--pipeline", "-p")] = None,
    workspace: WorkspaceOpt = Path("workspace"),
    set_: SetOpt = None,
    smoke: SmokeOpt = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="start the node over")] = False,
    resume: Annotated[bool, typer.Option("--resume/--no-resume")] = True,
    folders: Annotated[
        str, typer.Option("--folders", help="content: <node>/<fingerprint>/ folders; fixed: DVC's fixed folders")
    ] = "content",
    layout: Annotated[str | None, typer.Option("--layout", hidden=True, help="deprecated: --folders")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="run even if complete (a training node still resumes)")
    ] = False,
    num_machines: MachinesOpt = None,
    machine_rank: MachineRankOpt = None,
    main_process_ip: MainIpOpt = None,
    main_process_port: MainPortOpt = None,
) -> None:
    """Run one node without Prefect (its inputs must have completed)."""
    from flowpost.core.process_group import export_topology
    from flowpost.tasks.bare_node import run_bare_node

    if ctx.info_name == "stage":
        typer.echo("warning: `flowpost stage` is now `flowpost run-node`", err=True)
    if layout is not None:
        typer.echo("warning: `--layout` is now `--folders`", err=True)
        folders = layout
    export_topology(num_machines, machine_rank, main_process_ip, main_process_port)
    config = _load(pipeline, set_, smoke=smoke)
    result = run_bare_node(
        config, workspace, node, folders=folders, refresh=refresh, resume=resume, force=force, on_event=_print_event
    )
    typer.echo(f"{result.node} {result.status} -> {result.path}")


app.command("stage", hidden=True, help="Deprecated: `flowpost run-node`.")(run_node)


@dvc_app.command("sync")
def dvc_sync(
    pipeline: PipelineArg = None,
    set_: SetOpt = None,
    root: Annotated[Path, typer.Option("--root", help="the DVC repository root")] = Path("."),
    check: Annotated[bool, typer.Option("--check", help="check the files are in sync (exit 1 if not)")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite files that flowpost did not write")] = False,
) -> None:
    """Write params.yaml (the resolved pipeline) and dvc.yaml (one DVC stage per node)."""
    from flowpost.tasks.dvc import check_in_sync, sync

    if check and force:
        raise FlowpostError("--check only compares the files and --force overwrites them; pass one", where="--force")
    if not root.is_dir():
        raise FlowpostError(f"{root} is not a folder; pass the DVC repository's root folder", where="--root")
    config = _load(pipeline, set_)
    if check:
        check_in_sync(config, root)
        typer.echo("params.yaml and dvc.yaml are in sync")
        return
    changed = sync(config, root, force=force)
    typer.echo("\n".join(f"wrote {path}" for path in changed) or "params.yaml and dvc.yaml already in sync")


@dvc_app.command("code")
def dvc_code(
    out: Annotated[Path, typer.Argument(help="the folder to write <node>.json into")],
    pipeline: Annotated[Path | None, typer.Option("--pipeline", "-p")] = None,
) -> None:
    """Write each node's code fingerprint (the flowpost modules it runs, its numeric libraries' versions) to
    OUT/<node>.json: DVC's ``code`` stage."""
    from flowpost.core.io import check_output_file
    from flowpost.tasks.dvc import write_code_files

    if out.exists() and not out.is_dir():
        raise FlowpostError(f"{out} is a file; give a folder, e.g. workspace/code", where="OUT")
    check_output_file(out / "node.json", where="OUT", example="node.json")
    written = write_code_files(_load(pipeline, None), out)
    typer.echo("\n".join(f"{node} code {code[:12]}" for node, code in written.items()) + f"\n-> {out}")


@app.command("check-consistency")
def check_consistency(
    pipeline: PipelineArg = None,
    stage_name: Annotated[str, typer.Option("--stage", help="a coupled stage, e.g. grpo")] = "grpo",
    workspace: WorkspaceOpt = Path("workspace"),
    set_: SetOpt = None,
) -> None:
    """One rollout and one replay exactly as the trainer does them; prints a JSON line."""
    import json

    from flowpost.tasks.consistency import stage_consistency

    result = stage_consistency(_load(pipeline, set_), workspace, stage_name)
    typer.echo(json.dumps(result))
    if not result["ok"]:
        raise typer.Exit(1)


@app.command()
def validate(pipeline: Annotated[Path, typer.Argument()], set_: SetOpt = None) -> None:
    """Check a pipeline file without running anything (exit 0 when valid; warnings name what cannot learn)."""
    warnings: list[str] = []
    config = _load(pipeline, set_, warnings=warnings)
    typer.echo(f"{pipeline}: valid pipeline {config.name!r} with stages {', '.join(config.stages)}")
    for warning in warnings:
        typer.echo(f"warning: {warning}")


@config_app.command("show")
def config_show(pipeline: PipelineArg = None, set_: SetOpt = None) -> None:
    """Print the resolved pipeline (defaults filled in, overrides applied)."""
    import yaml

    from flowpost.core.config.loading import pipeline_to_dict

    typer.echo(yaml.safe_dump(pipeline_to_dict(_load(pipeline, set_)), sort_keys=False))


@app.command()
def sample(
    export: Annotated[Path, typer.Argument(help="an export (or any saved model) folder")],
    prompt: Annotated[str, typer.Option("--prompt")],
    n: Annotated[int, typer.Option("-n", min=1)] = 16,
    out: Annotated[
        Path | None, typer.Option("--out", help="default: grid.png, or sample.mp4 for a video model")
    ] = None,
    steps: Annotated[int, typer.Option(min=1)] = 20,
    guidance: Annotated[float, typer.Option()] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    base: Annotated[
        str | None,
        typer.Option("--base", help="the base pipeline (folder or hub id), when it moved since training"),
    ] = None,
) -> None:
    """Generate ``n`` samples of one prompt into a PNG grid (a video model: an mp4 of the clips tiled)."""
    from flowpost.core.io import file_errors_reported
    from flowpost.core.sampling.generate import sample_prompts
    from flowpost.tasks.integrity import COMPLETE, completed_damage

    if (export / COMPLETE).is_file() and (problem := completed_damage(export)):
        raise FlowpostError(
            f"export is damaged: {problem} since it completed; rebuild it with `flowpost run` (it reruns damaged "
            "nodes) or `flowpost run-node export`",
            where=str(export),
        )
    with file_errors_reported("flowpost sample", where=out or export):
        _, written = sample_prompts(export, [prompt] * n, out=out, steps=steps, guidance=guidance, seed=seed, base=base)
    typer.echo(f"wrote {written}")


@app.command("list")
def list_(
    what: Annotated[str, typer.Argument(help="trainers | models | rewards | metrics | datasets | encoders")],
) -> None:
    """Print a registry: name and import target, and for a plugin the package declaring it."""
    from flowpost.core.registries import registry

    for name, entry in registry(what).items():
        typer.echo(f"{name}\t{entry.target}" + (f"\tplugin: {entry.plugin}" if entry.plugin else ""))


@app.command("reward-server")
def reward_server(
    name: Annotated[str, typer.Argument(help="a registered reward (flowpost list rewards)")],
    option: Annotated[
        list[str] | None, typer.Option("--option", help="constructor option, e.g. assets_dir=data")
    ] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8765,
    token_env: Annotated[
        str | None, typer.Option("--token-env", help="environment variable holding a bearer token to require")
    ] = None,
    version: Annotated[
        str | None,
        typer.Option("--version", help="model version GET /health reports (default: hash of name and options)"),
    ] = None,
    max_body_mb: Annotated[
        int, typer.Option("--max-body-mb", min=1, help="largest request body in MiB (413 above)")
    ] = 256,
    max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="most images per request (413 above)")] = 1024,
) -> None:
    """Serve a registered reward over HTTP (POST /score, GET /health) until Ctrl-C.

    Listening on an address other than loopback needs --token-env.
    """
    import yaml

    from flowpost.core.rewards.score_app import MIB, Limits
    from flowpost.core.rewards.server import serve_registered_reward

    where = "flowpost reward-server"
    options = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise FlowpostError(f"--option {item!r} must be KEY=VALUE", where=where)
        options[key] = yaml.safe_load(value)
    token = None
    if token_env is not None:
        token = os.environ.get(token_env)
        if not token:
            raise FlowpostError(f"environment variable {token_env} (--token-env) is not set", where=where)
    limits = Limits(max_body_bytes=max_body_mb * MIB, max_batch=max_batch)
    server = serve_registered_reward(
        name, options, host=host, port=port, token=token, version=version, limits=limits, where=where
    )
    typer.echo(f"serving reward {name!r} version {server.version} at {server.url} (health: GET /health); Ctrl-C stops")
    server.serve_until_interrupted()


def _print_event(event: Event) -> None:
    from flowpost.core.events import GuardEvent, StartEvent

    typer.echo(("warning: " if isinstance(event, GuardEvent) and event.violations else "") + event.describe())
    if isinstance(event, StartEvent) and (warning := event.resume_warning()):
        typer.echo(f"warning: {warning}")


def _quiet_prefect_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def main() -> None:
    """Entry point: user errors print one message and exit 1, without a traceback."""
    try:
        app(prog_name="flowpost", standalone_mode=True)
    except FlowpostError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        sys.exit(1)


if __name__ == "__main__":
    main()
