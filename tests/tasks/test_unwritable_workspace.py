"""Workspaces that cannot be written: a read-only folder, a read-only node folder, and writes that fail
part-way (a file-size limit the kernel enforces, as a full disk does) end with one message naming the
file, leave no completed node behind, and the node runs cleanly once the cause is gone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from cli_main import flowpost_main
from unwritable import file_size_limit, read_only

from flowpost.core.config.loading import validate_pipeline
from flowpost.errors import FlowpostError
from flowpost.tasks.integrity import COMPLETE
from flowpost.tasks.runner import PipelineRun

LIMIT = 8192  # bytes: above every manifest these nodes write, below the weights and the report they write


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--smoke"],
        ["run-node", "acquire.digits", "--smoke"],
        ["check-consistency", "--stage", "grpo"],
        ["plan"],
        ["serve"],
        ["deploy", "--pool", "p"],
    ],
    ids=lambda command: " ".join(command),
)
def test_a_read_only_workspace_is_refused_before_anything_is_written(tmp_path: Path, command: list[str]) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with read_only(workspace):
        outcome = flowpost_main(*command, "--workspace", str(workspace))
    assert outcome.code == 1, outcome
    assert outcome.stderr == (
        f"error: {workspace}: cannot write in {workspace} (read-only or not yours); pass a writable folder "
        "with --workspace\n"
    )
    assert list(workspace.iterdir()) == []


def test_a_read_only_node_folder_fails_the_node_naming_it(tmp_path: Path, tiny_pipeline) -> None:
    run = PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path)
    (tmp_path / "acquire.digits").mkdir()
    with read_only(tmp_path / "acquire.digits"):
        with pytest.raises(FlowpostError) as raised:
            run.execute("acquire.digits")
    assert raised.value.where == str(run.path("acquire.digits"))
    assert "writing or reading it failed (" in str(raised.value) and "make the folder writable" in str(raised.value)
    assert list((tmp_path / "acquire.digits").iterdir()) == []


@pytest.mark.parametrize(
    ("node", "failing"),
    [("export", "transformer/diffusion_pytorch_model.safetensors"), ("report", "report.md")],
)
def test_a_write_that_fails_part_way_names_the_file_and_the_node_runs_again_once_it_can(
    tmp_path: Path, completed_workspace, tiny_pipeline, node: str, failing: str
) -> None:
    workspace, pipeline = tmp_path / "ws", tmp_path / "tiny.yaml"
    shutil.copytree(completed_workspace[0], workspace)
    pipeline.write_text(yaml.safe_dump(tiny_pipeline()))
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    folder = run.path(node)
    with file_size_limit(LIMIT):
        outcome = flowpost_main(
            "run-node", node, "--refresh", "--pipeline", str(pipeline), "--workspace", str(workspace)
        )
    assert outcome.code == 1, outcome
    assert outcome.stderr == (
        f"error: {folder / failing}: writing or reading it failed (File too large); check the path, free space on "
        "the disk or make the folder writable, then run it again\n"
    )
    assert not (folder / COMPLETE).exists() and not list(folder.rglob(".*.tmp"))
    again = run.execute(node)
    assert again.status == "ran" and run.is_complete(node) and run.damage(node) is None


def test_final_weights_that_cannot_be_written_name_the_folder_and_the_stage_finishes_once_they_can(
    tmp_path: Path, completed_workspace, tiny_pipeline
) -> None:
    workspace, pipeline = tmp_path / "ws", tmp_path / "tiny.yaml"
    shutil.copytree(completed_workspace[0], workspace)
    pipeline.write_text(yaml.safe_dump(tiny_pipeline()))
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    folder = run.path("train.sft")
    shutil.rmtree(folder / "final")
    (folder / COMPLETE).unlink()  # the last checkpoint is the last step: the stage only writes its final weights
    with file_size_limit(LIMIT):
        outcome = flowpost_main("run-node", "train.sft", "--pipeline", str(pipeline), "--workspace", str(workspace))
    assert outcome.code == 1, outcome
    assert "Traceback" not in outcome.stdout + outcome.stderr, outcome
    assert outcome.stderr.splitlines()[-1].startswith(
        f"error: {folder / 'final' / 'live'}: writing the final weights failed (File too large); check the path"
    ), outcome.stderr
    assert not (folder / COMPLETE).exists() and not (folder / "final" / "live").exists()
    again = run.execute("train.sft")
    assert again.status == "ran" and run.damage("train.sft") is None


def test_publishing_the_report_into_a_workspace_that_cannot_take_it_names_the_file(
    tmp_path: Path, completed_workspace, tiny_pipeline
) -> None:
    workspace = tmp_path / "ws"
    shutil.copytree(completed_workspace[0], workspace)
    (workspace / "report.md").unlink()
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    with file_size_limit(LIMIT), pytest.raises(FlowpostError, match="publishing the report failed") as raised:
        run.publish_report()
    assert raised.value.where == str(workspace / "report.md")
    assert not (workspace / "report.md").exists() and not list(workspace.glob(".*.tmp"))


def test_dvc_sync_and_code_that_cannot_write_name_the_file_and_leave_no_partial_one(tmp_path: Path) -> None:
    with file_size_limit(512):
        outcome = flowpost_main("dvc", "sync", "--root", str(tmp_path))
    assert outcome.code == 1, outcome
    assert outcome.stderr.startswith(f"error: {tmp_path / 'params.yaml'}: `flowpost dvc sync` failed (File too large)")
    assert _files(tmp_path) == {}
    with file_size_limit(16):
        outcome = flowpost_main("dvc", "code", str(tmp_path))
    assert outcome.code == 1, outcome
    first = tmp_path / "acquire.digits.json"
    assert outcome.stderr.startswith(f"error: {first}: writing the code fingerprint failed (File too")
    with read_only(tmp_path):
        outcome = flowpost_main("dvc", "code", str(tmp_path))
    assert outcome.stderr == f"error: OUT: cannot write in {tmp_path} (read-only or not yours); choose another path\n"
    assert _files(tmp_path) == {}


def test_sample_into_a_read_only_folder_is_refused_before_loading_the_model(
    tmp_path: Path, completed_workspace
) -> None:
    export = next((completed_workspace[0] / "export").iterdir())
    out = tmp_path / "grid.png"
    with read_only(tmp_path):
        outcome = flowpost_main("sample", str(export), "--prompt", "a digit", "-n", "1", "--out", str(out))
    assert outcome.code == 1, outcome
    assert outcome.stderr == f"error: --out: cannot write in {tmp_path} (read-only or not yours); choose another path\n"
    assert list(tmp_path.iterdir()) == []
