"""The workspace folder a command writes under, checked before anything is written in it."""

from __future__ import annotations

import os
from pathlib import Path

from flowpost.errors import FlowpostError


def checked_workspace(workspace: str | Path) -> Path:
    """``workspace`` resolved; a FlowpostError when it is a file, lies under a file, or cannot be written."""
    path = Path(workspace).resolve()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise FlowpostError(f"the workspace {where}; pass a folder with --workspace", where=str(path))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FlowpostError(
            f"cannot write in {existing} (read-only or not yours); pass a writable folder with --workspace",
            where=str(path),
        )
    return path
