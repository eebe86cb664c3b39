"""`flowpost dvc sync` keeps hand-written params.yaml / dvc.yaml unless told --force."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.core.config.loading import load_pipeline
from flowpost.errors import FlowpostError
from flowpost.tasks.dvc import HEADER, sync

HAND_WRITTEN = "stages:\n  mine: {cmd: make}\n"


def test_a_hand_written_file_is_kept_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "dvc.yaml").write_text(HAND_WRITTEN)
    with pytest.raises(FlowpostError) as info:
        sync(load_pipeline(None), tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: {tmp_path / 'dvc.yaml'} not written by `flowpost dvc sync` (no header line); move it "
        "aside, or pass --force to overwrite it"
    )
    assert (tmp_path / "dvc.yaml").read_text() == HAND_WRITTEN and not (tmp_path / "params.yaml").exists()


def test_files_flowpost_wrote_are_rewritten_and_force_overwrites_the_rest(tmp_path: Path) -> None:
    pipeline = load_pipeline(None)
    sync(pipeline, tmp_path)
    (tmp_path / "params.yaml").write_text(HEADER + "stale: true\n")
    assert sync(pipeline, tmp_path) == [tmp_path / "params.yaml"]
    (tmp_path / "params.yaml").write_text(HAND_WRITTEN)
    assert sync(pipeline, tmp_path, force=True) == [tmp_path / "params.yaml"]
    assert (tmp_path / "params.yaml").read_text().startswith(HEADER)


def test_the_cli_refuses_then_overwrites_with_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(HAND_WRITTEN)
    refused = CliRunner().invoke(app, ["dvc", "sync"])
    assert isinstance(refused.exception, FlowpostError) and "pass --force" in str(refused.exception)
    assert Path("params.yaml").read_text() == HAND_WRITTEN and not Path("dvc.yaml").exists()
    forced = CliRunner().invoke(app, ["dvc", "sync", "--force"])
    assert forced.exit_code == 0, forced.output
    assert sorted(os.listdir()) == ["dvc.yaml", "params.yaml"] and "wrote params.yaml" in forced.output
