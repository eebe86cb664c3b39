"""atomic_directory never leaves a moment without a complete version of the folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from flowpost.core import io as fio
from flowpost.core.io import atomic_directory


def _complete_version_present(final: Path) -> bool:
    """``final`` holds a complete folder, or one sits aside next to it."""
    candidates = [final, *final.parent.glob(f".{final.name}.*.old")]
    return any((c / "old.txt").exists() or (c / "new.txt").exists() for c in candidates if c.is_dir())


def test_replacing_keeps_the_old_version_until_the_new_one_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    final = tmp_path / "step-1"
    final.mkdir()
    (final / "old.txt").write_text("old")
    real_replace, real_rmtree = os.replace, shutil.rmtree
    removed: list[Path] = []

    def checked_replace(src, dst):  # noqa: ANN001, ANN202
        assert _complete_version_present(final)
        real_replace(src, dst)
        assert _complete_version_present(final)

    def checked_rmtree(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        assert (final / "new.txt").exists(), "the old version was deleted before the new one was in place"
        removed.append(Path(path))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(fio.os, "replace", checked_replace)
    monkeypatch.setattr(fio.shutil, "rmtree", checked_rmtree)
    with atomic_directory(final) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]
    assert removed


def test_a_failed_swap_puts_the_old_version_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "step-1"
    final.mkdir()
    (final / "old.txt").write_text("old")
    real_replace = os.replace

    def failing_replace(src, dst):  # noqa: ANN001, ANN202
        if ".tmp" in str(src):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(fio.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"), atomic_directory(final) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]


def test_a_new_folder_appears_by_rename(tmp_path: Path) -> None:
    with atomic_directory(tmp_path / "out") as tmp:
        (tmp / "a").write_text("a")
    assert (tmp_path / "out" / "a").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
