"""A workspace that turns read-only as a training stage starts (its disk remounted read-only, say) fails the
node with one message saying the workspace cannot be written and what to do, not the stage's failure to
record its own error."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import flowpost.tasks.train as train
from flowpost.core.config.loading import validate_pipeline
from flowpost.errors import FlowpostError
from flowpost.tasks.runner import PipelineRun


def _set_read_only(folders: list[Path], on: bool) -> None:
    """Root ignores permission bits: the immutable flag stops it creating files in ``folders`` too."""
    for folder in folders:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i" if on else "-i", str(folder)], check=True, capture_output=True)
        else:
            folder.chmod(0o555 if on else 0o755)


def test_a_workspace_that_turns_read_only_mid_stage_is_named(
    tmp_path: Path, completed_workspace, tiny_pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    shutil.copytree(completed_workspace[0], workspace)
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    folders: list[Path] = []
    popen = subprocess.Popen

    def read_only_from_here(command, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if "flowpost.stage" in command and not folders:  # the stage starts: the workspace turns read-only
            folders.extend(p for p in [workspace, *workspace.rglob("*")] if p.is_dir())
            _set_read_only(folders, True)
        return popen(command, *args, **kwargs)

    monkeypatch.setattr(train.subprocess, "Popen", read_only_from_here)
    try:
        with pytest.raises(FlowpostError) as raised:
            run.execute("train.sft", refresh=True)
    finally:
        _set_read_only(folders, False)
    out = run.path("train.sft")
    assert str(raised.value).startswith(f"{out}: node train.sft failed: its folder cannot be written (")
    assert f"make the workspace {workspace} writable" in str(raised.value)
    assert "\n" not in str(raised.value) and "rank-0.error" not in str(raised.value)
