"""Which checkpoints ``evaluate.every`` scores, read from each checkpoint's own progress counters."""

from __future__ import annotations

from pathlib import Path

import torch

from flowpost.core.checkpoint import TrainingState, save_checkpoint
from flowpost.tasks.curve import due_checkpoints


def _checkpoint(root: Path, *, optimizer_step: int, rollout_iteration: int) -> Path:
    weights = {"w": torch.full((2,), float(optimizer_step))}
    state = TrainingState(
        step=optimizer_step,
        model=weights,
        optimizer={},
        scheduler={},
        snapshots={},
        rng={"torch": torch.get_rng_state()},
        trainer={"progress": {"optimizer_step": optimizer_step, "rollout_iteration": rollout_iteration}},
    )
    return save_checkpoint(root, state)


def test_dataset_stages_count_optimizer_steps_and_generation_stages_iterations(tmp_path: Path) -> None:
    for iteration in range(1, 7):  # two optimizer steps per rollout iteration, a checkpoint at each
        _checkpoint(tmp_path, optimizer_step=2 * iteration, rollout_iteration=iteration)
    by_steps = due_checkpoints(tmp_path, every=4, counter="optimizer_step", smoke=False)
    by_iterations = due_checkpoints(tmp_path, every=4, counter="rollout_iteration", smoke=False)
    assert [p.name for p in by_steps] == ["step-4", "step-8", "step-12"]
    assert [p.name for p in by_iterations] == ["step-8"]
    smoke = due_checkpoints(tmp_path, every=4, counter="rollout_iteration", smoke=True)
    assert [p.name for p in smoke] == [f"step-{2 * i}" for i in range(1, 7)]  # oldest first, every one


def test_a_stage_without_checkpoints_has_none_due(tmp_path: Path) -> None:
    assert due_checkpoints(tmp_path / "checkpoints", every=2, counter="optimizer_step", smoke=False) == []
