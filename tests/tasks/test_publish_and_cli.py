"""The workspace-root report is replaced atomically; ``flowpost run-node --smoke`` applies the profile."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_main import flowpost_main
from typer.testing import CliRunner

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.runner import COMPLETE, PipelineRun


def test_publish_report_replaces_the_root_files_by_rename(tmp_path: Path, tiny_pipeline) -> None:
    run = PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path)
    report = run.path("report")
    report.mkdir(parents=True)
    (report / "metrics.json").write_text(json.dumps({"sft": {"step": 3}}))
    (report / "report.md").write_text("# new\n")
    (report / COMPLETE).write_text(json.dumps({"fingerprint": run.fingerprints["report"]}))
    old = tmp_path / "metrics.json"
    old.write_text(json.dumps({"sft": {"step": 1}}))
    with old.open() as reader:  # a reader of the previous file keeps reading a complete version
        assert run.publish_report() == old
        assert json.loads(reader.read()) == {"sft": {"step": 1}}
    assert json.loads(old.read_text()) == {"sft": {"step": 3}}
    assert (tmp_path / "report.md").read_text() == "# new\n"
    assert not list(tmp_path.glob(".*.tmp"))


def test_run_node_accepts_smoke(tmp_path: Path) -> None:
    """``--smoke`` reaches the pipeline the node runs in: the input folder it asks for is the smoke one."""
    from flowpost.cli import app
    from flowpost.core.config.loading import load_pipeline

    needed = {}
    for flags, overrides in ((["--smoke"], ["smoke=true"]), ([], [])):
        needed[bool(flags)] = PipelineRun(load_pipeline(None, overrides), tmp_path).path("acquire.digits")
        result = CliRunner().invoke(app, ["run-node", "train.sft", *flags, "-w", str(tmp_path)])
        assert result.exit_code == 1
        assert str(result.exception).startswith(f"{needed[bool(flags)]}: node train.sft needs acquire.digits")
    assert needed[True] != needed[False] and list(tmp_path.iterdir()) == []


def test_the_deprecated_stage_command_warns_then_runs_the_node_as_run_node_does(
    tmp_path: Path, monkeypatch, tiny_pipeline
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text("a red cat\na blue dog\n")
    pipeline = tiny_pipeline()
    pipeline["datasets"]["prompts"] = {"source": "prompt-files", "path": "prompts.txt"}
    Path("pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    outcomes = {
        command: flowpost_main(command, "acquire.prompts", "-p", "pipeline.yaml", "-w", command)
        for command in ("run-node", "stage")
    }
    assert outcomes["run-node"].code == outcomes["stage"].code == 0
    assert outcomes["stage"].stderr.splitlines()[0] == "warning: `flowpost stage` is now `flowpost run-node`"
    assert "warning" not in outcomes["run-node"].stderr
    assert outcomes["run-node"].stdout.replace("run-node/", "stage/") == outcomes["stage"].stdout
    prompts = {command: [path.read_bytes() for path in Path(command).rglob("prompts.jsonl")] for command in outcomes}
    assert prompts["run-node"] == prompts["stage"] != []


def test_run_node_refuses_unknown_folders(tmp_path: Path) -> None:
    from flowpost.cli import app

    result = CliRunner().invoke(app, ["run-node", "acquire.digits", "--folders", "flat", "-w", str(tmp_path)])
    assert result.exit_code == 1 and "--folders: unknown folders 'flat'; use content or fixed" in str(result.exception)


def test_run_node_prints_each_event_and_the_resume_warning(capsys) -> None:
    from flowpost.cli import _print_event
    from flowpost.core.events import ProgressEvent, StartEvent

    _print_event(ProgressEvent(stage="sft", step=1, budget=3, metrics={"loss": 0.25}))
    _print_event(
        StartEvent(
            stage="sft",
            step=2,
            budget=3,
            resumed_from="ckpt",
            ranks=1,
            resumed_with_ranks_from=2,
            resumed_with_layout_from="ddp",
        )
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["step 1/3 loss=0.25", "resuming from ckpt at step 2"]
    assert lines[2].startswith("warning: checkpointed with 2 ddp process(es) and resumed with 1:") and len(lines) == 3
