"""Where a result came from: git state, library versions."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = (
    "flowpost",
    "torch",
    "diffusers",
    "transformers",
    "accelerate",
    "peft",
    "safetensors",
    "numpy",
)


def git_state(path: str | Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the git work tree holding ``path`` (the package by default)."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
