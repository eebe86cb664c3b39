"""Atomic writes give files and folders the modes the umask allows, as open() and mkdir() would."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowpost.core.io import atomic_directory, write_bytes_atomic, write_json_atomic


@pytest.fixture(params=[0o022, 0o002, 0o077])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_get_the_umask_default_mode(tmp_path: Path, umask: int) -> None:
    write_bytes_atomic(tmp_path / "a.bin", b"x")
    write_json_atomic(tmp_path / "a.json", {"a": 1})
    assert _mode(tmp_path / "a.bin") == _mode(tmp_path / "a.json") == 0o666 & ~umask
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert _mode(tmp_path / "a.bin") == _mode(plain)


def test_folders_get_the_umask_default_mode(tmp_path: Path, umask: int) -> None:
    with atomic_directory(tmp_path / "node") as tmp:
        write_bytes_atomic(tmp / "inside.bin", b"x")
    assert _mode(tmp_path / "node") == 0o777 & ~umask
    assert _mode(tmp_path / "node" / "inside.bin") == 0o666 & ~umask
    (tmp_path / "plain").mkdir()
    assert _mode(tmp_path / "node") == _mode(tmp_path / "plain")
