"""`flowpost sample` with paths it cannot use: one message each, nothing loaded or written."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.errors import FlowpostError


def _sample_error(export: Path, out: Path) -> str:
    result = CliRunner().invoke(app, ["sample", str(export), "--prompt", "a seven", "--out", str(out)])
    assert isinstance(result.exception, FlowpostError), result.exception
    return str(result.exception)


def test_a_folder_as_out_is_refused(tmp_path: Path) -> None:
    assert _sample_error(tmp_path / "export", tmp_path) == (
        f"--out: {tmp_path} is a folder; give a file path, e.g. {tmp_path / 'grid.png'}"
    )


def test_an_out_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    out = tmp_path / "notes.txt" / "grid.png"
    assert _sample_error(tmp_path / "export", out) == (
        f"--out: {tmp_path / 'notes.txt'} is a file, so {out} cannot be written under it; choose another path"
    )


def test_a_file_as_the_export_is_refused(tmp_path: Path) -> None:
    export = tmp_path / "model.safetensors"
    export.write_bytes(b"")
    assert _sample_error(export, tmp_path / "grid.png") == (
        f"sample: {export} is a file; give an export (or saved model) folder"
    )
    assert not (tmp_path / "grid.png").exists()
