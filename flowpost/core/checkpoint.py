"""Exact-resume training state and model-only exports, written atomically.

A checkpoint is ``checkpoints/step-N/`` with safetensors for tensors, ``optimizer.pt`` (read back
with ``weights_only=True``), ``state.json`` for counters, and ``manifest.json`` (file hashes)
written last inside the folder; the folder appears by rename, and ``checkpoints/latest`` (a JSON
pointer) moves after it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from flowpost.core.io import atomic_directory, hash_mismatch, read_json, sha256_file, write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.errors import FlowpostError

log = get_logger(__name__)
LATEST = "latest"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class TrainingState:
    """Everything a rank needs to continue a stage exactly where it stopped."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    snapshots: dict[str, dict[str, torch.Tensor]]
    rng: dict[str, torch.Tensor]
    trainer: dict[str, Any]
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)  # further roles: optimizer and scheduler


def save_checkpoint(
    root: str | Path, state: TrainingState, *, keep_last: int | None = None, also_keep: tuple[Path, ...] = ()
) -> Path:
    """Write ``root/step-N`` atomically, point ``root/latest`` at it, then keep the newest ``keep_last``
    (and ``also_keep``)."""
    root = Path(root)
    final = root / f"step-{state.step}"
    try:
        with atomic_directory(final) as tmp:
            save_file(_contiguous(state.model), tmp / "model.safetensors")
            for name, tensors in state.snapshots.items():
                save_file(_contiguous(tensors), tmp / f"snapshot-{name}.safetensors")
            save_file(_contiguous(state.rng), tmp / "rng.safetensors")
            torch.save(
                {"optimizer": state.optimizer, "scheduler": state.scheduler, "roles": state.roles}, tmp / "optimizer.pt"
            )
            write_json_atomic(tmp / "state.json", {"step": state.step, "trainer": state.trainer})
            files = sorted(p.name for p in tmp.iterdir())
            write_json_atomic(tmp / MANIFEST, {"step": state.step, "files": {f: sha256_file(tmp / f) for f in files}})
        write_json_atomic(root / LATEST, {"step": state.step, "path": final.name})
    except OSError as exc:
        previous = latest_checkpoint(root)
        resumes = f"it resumes from {previous.name}" if previous is not None else "it starts from the beginning"
        raise FlowpostError(
            f"cannot write the checkpoint of step {state.step} ({exc.strerror or exc}); free space or fix the "
            f"folder, then run the stage again: {resumes}",
            where=str(final),
        ) from exc
    if keep_last is not None:
        _prune(root, keep=(final, *also_keep), keep_last=keep_last)
    return final


def _step_dirs(root: Path) -> list[Path]:
    """``root``'s ``step-N`` folders, newest first."""
    steps = [p for p in root.glob("step-*") if _STEP_DIR.match(p.name)]
    return sorted(steps, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), reverse=True)  # type: ignore[union-attr]


def step_checkpoints(root: str | Path) -> list[Path]:
    """``root``'s ``step-N`` folders, oldest first (none when ``root`` does not exist)."""
    return _step_dirs(Path(root))[::-1]


def _prune(root: Path, *, keep: tuple[Path, ...], keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step folders; those in ``keep`` (the one just written first)
    always stay."""
    for old in [p for p in _step_dirs(root) if p != keep[0]][max(keep_last - 1, 0) :]:
        if old not in keep:
            shutil.rmtree(old, ignore_errors=True)


def verify_checkpoint(path: Path) -> str | None:
    """None if every file matches the manifest, else why not."""
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        return "no manifest (partial write)"
    try:
        manifest = read_json(manifest_path, what="checkpoint manifest")
    except FlowpostError as exc:
        return str(exc)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return "manifest lists no files"
    return hash_mismatch(path, files)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest intact checkpoint under ``root``: ``latest`` if valid, else the newest valid step.

    The returned folder has just been verified against its manifest; pass ``verified=True`` to
    ``load_checkpoint`` to skip hashing it again.
    """
    root = Path(root)
    candidates: list[Path] = []
    pointer = root / LATEST
    if pointer.exists():
        try:
            target = read_json(pointer, what="latest pointer")
        except FlowpostError:
            target = None
        name = target.get("path") if isinstance(target, dict) else None
        if isinstance(name, str) and _STEP_DIR.match(name):  # a sibling step folder, nothing else
            candidates.append(root / name)
        else:
            log.warning("%s is unreadable or names no checkpoint; scanning for checkpoints", pointer)
    candidates.extend(p for p in _step_dirs(root) if p not in candidates)
    for path in candidates:
        problem = verify_checkpoint(path) if path.is_dir() else "missing"
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s", path, problem)
    return None


def load_checkpoint(path: str | Path, *, verified: bool = False) -> TrainingState:
    """Read a checkpoint written by ``save_checkpoint``; its hashes are checked unless ``verified``."""
    path = Path(path)
    problem = None if verified else verify_checkpoint(path)
    if problem is not None:
        raise FlowpostError(f"checkpoint is corrupt: {problem}; delete it to start over", where=str(path))
    meta = read_json(path / "state.json", what="checkpoint state")
    extras = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
    snapshots = {
        p.name.removeprefix("snapshot-").removesuffix(".safetensors"): load_file(p)
        for p in sorted(path.glob("snapshot-*.safetensors"))
    }
    return TrainingState(
        step=int(meta["step"]),
        model=load_file(path / "model.safetensors"),
        optimizer=extras["optimizer"],
        scheduler=extras["scheduler"],
        snapshots=snapshots,
        rng=load_file(path / "rng.safetensors"),
        trainer=meta["trainer"],
        roles=extras.get("roles", {}),
    )


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.detach().contiguous().cpu() for key, value in tensors.items()}
