"""The workspace-root report is replaced atomically; ``flowpost stage --smoke`` applies the profile."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_stage_command_accepts_smoke(tmp_path: Path) -> None:
    """``--smoke`` reaches the pipeline the node runs in: the input folder it asks for is the smoke one."""
    from flowpost.cli import app
    from flowpost.core.config.loading import load_pipeline

    needed = {}
    for flags, overrides in ((["--smoke"], ["smoke=true"]), ([], [])):
        needed[bool(flags)] = PipelineRun(load_pipeline(None, overrides), tmp_path).path("acquire.digits")
        result = CliRunner().invoke(app, ["stage", "train.sft", *flags, "-w", str(tmp_path)])
        assert result.exit_code == 1
        assert str(result.exception).startswith(f"{needed[bool(flags)]}: node train.sft needs acquire.digits")
    assert needed[True] != needed[False] and list(tmp_path.iterdir()) == []


def test_stage_command_refuses_an_unknown_layout(tmp_path: Path) -> None:
    from flowpost.cli import app

    result = CliRunner().invoke(app, ["stage", "acquire.digits", "--layout", "flat", "-w", str(tmp_path)])
    assert result.exit_code == 1 and "--layout: unknown layout 'flat'; use content or fixed" in str(result.exception)


def test_the_stage_command_prints_each_event_and_the_resume_warning(capsys) -> None:
    from flowpost.cli import _print_event
    from flowpost.core.events import StartEvent, StepEvent

    _print_event(StepEvent(stage="sft", step=1, max_steps=3, metrics={"loss": 0.25}))
    _print_event(
        StartEvent(
            stage="sft",
            step=2,
            max_steps=3,
            resumed_from="ckpt",
            ranks=1,
            resumed_with_ranks_from=2,
            resumed_with_layout_from="ddp",
        )
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["step 1/3 loss=0.25", "resuming from ckpt (step 2)"]
    assert lines[2].startswith("warning: checkpointed with 2 ddp process(es) and resumed with 1:") and len(lines) == 3
