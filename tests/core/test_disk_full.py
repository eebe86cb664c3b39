"""A full disk during a checkpoint or a weights write is one message naming the path, never safetensors' own
error; the latest checkpoint stays loadable. The disk is a small tmpfs (``tests/unwritable.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from unwritable import small_disk

from flowpost.core.checkpoint import TrainingState, latest_checkpoint, load_checkpoint, save_checkpoint
from flowpost.core.io import atomic_directory, file_errors_reported
from flowpost.errors import FlowpostError


def _state(step: int, numbers: int) -> TrainingState:
    return TrainingState(
        step=step,
        model={"weight": torch.ones(numbers)},
        optimizer={},
        scheduler={},
        snapshots={},
        rng={"torch": torch.get_rng_state()},
        trainer={},
    )


def test_a_full_disk_during_a_checkpoint_names_it_and_the_previous_one_resumes(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "checkpoints"
        save_checkpoint(root, _state(1, 16))
        with pytest.raises(FlowpostError) as raised:
            save_checkpoint(root, _state(2, 1 << 20))  # 4 MiB of weights on a 256 KiB disk
        assert str(raised.value) == (
            f"{root / 'step-2'}: cannot write the checkpoint of step 2 (No space left on device); free space or "
            "fix the folder, then run the stage again: it resumes from step-1"
        )
        assert latest_checkpoint(root) == root / "step-1" and load_checkpoint(root / "step-1").step == 1
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step-1"]


def test_a_full_disk_during_a_weights_write_names_the_folder(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        with pytest.raises(OSError) as raised:
            with atomic_directory(disk / "final") as tmp:
                save_file({"weight": torch.ones(1 << 20)}, tmp / "model.safetensors")
        assert raised.value.filename == str(disk / "final") and "No space left on device" in str(raised.value)
        with pytest.raises(FlowpostError) as reported:
            with file_errors_reported("writing or reading it", where=disk / "export"):
                save_file({"weight": torch.ones(1 << 20)}, disk / "model.safetensors")
        assert str(reported.value) == (
            f"{disk / 'export'}: writing or reading it failed (No space left on device); check the path, free "
            "space on the disk or make the folder writable, then run it again"
        )
        assert list(disk.iterdir()) == []
