"""The files a completed node hands on: hashed into its completion manifest, checked before each use."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.io import hash_mismatch, read_json_object, sha256_file
from flowpost.tasks.graph import NodeKind

COMPLETE = "_complete.json"
ATTEMPT = "_attempt.json"
HANDED_ON = {NodeKind.TRAIN: ("final", "stage.json")}  # a training node keeps its checkpoints and logs to itself
NODE_MANIFESTS = (COMPLETE, ATTEMPT)


def output_hashes(folder: Path, kind: NodeKind) -> dict[str, str]:
    """SHA-256 of each file a node of ``kind`` hands on (its whole folder unless ``HANDED_ON`` says
    otherwise), keyed by the path relative to ``folder``."""
    files: list[Path] = []
    for name in HANDED_ON.get(kind, ("",)):
        root = folder / name
        files += [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    named = {p.relative_to(folder).as_posix(): p for p in files}
    return {name: sha256_file(named[name]) for name in sorted(named) if name not in NODE_MANIFESTS}


def completed_damage(folder: Path) -> str | None:
    """Why the outputs of the completed node in ``folder`` cannot be used (a file missing or changed
    since it completed), or None; a manifest written before outputs were hashed records no files."""
    files = read_json_object(folder / COMPLETE, what="completion manifest").get("files", {})
    if not isinstance(files, dict):
        return f"{COMPLETE} lists no file hashes"
    return hash_mismatch(folder, files)
