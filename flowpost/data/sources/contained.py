"""A dataset's files stay inside its folder: no absolute path, ``..`` or symlink leads out unless allowed."""

from __future__ import annotations

from pathlib import Path

from flowpost.errors import FlowpostError

OPT_IN = "or set allow_outside: true on the dataset to read it where it is"


def contained(root: Path, base: Path, named: str, *, allow_outside: bool, where: str) -> Path:
    """The file ``named`` relative to ``base`` (a folder inside the dataset's ``root``); an absolute name,
    or one that resolves outside ``root`` (through ``..`` or a symlink), is a FlowpostError naming ``where``
    unless ``allow_outside``."""
    path = base / named
    if not allow_outside:
        if Path(named).is_absolute():
            raise FlowpostError(f"{named!r} is an absolute path; name it relative to {base}, {OPT_IN}", where=where)
        check_inside(root, path, where=where)
    return path


def check_inside(root: Path, path: Path, *, where: str) -> None:
    """Refuse ``path`` when it resolves (``..``, symlinks) outside ``root``."""
    target = path.resolve()
    if not target.is_relative_to(root.resolve()):
        raise FlowpostError(
            f"{path} leads outside {root} (to {target}); copy the file into the folder, {OPT_IN}", where=where
        )
