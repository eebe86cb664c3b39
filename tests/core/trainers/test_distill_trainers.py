"""Distillation stages on the tiny model: consistency, diffusion-opd and kd train, resume exactly,
keep the teacher frozen, and reject configurations they cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowpost.core.events import read_events
from flowpost.core.trainers.distill.consistency import ConsistencyTrainer
from flowpost.core.trainers.distill.opd import OPDTrainer
from flowpost.core.trainers.distill.teacher import TEACHER
from flowpost.errors import FlowpostError

INIT = "teacher-weights"  # the spec's init_from: distillation needs one (its weights are the adapter's)
EMA = {"ema": {"decay": 0.9, "schedule": "constant"}}
ROLLOUTS = {"prompts_per_iteration": 4, "group_size": 1, "rollout_batch_size": 4, "train_batch_size": 2}


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in trainer.adapter.module().named_parameters() if p.requires_grad}


def _step_metrics(out: Path) -> list[dict]:
    return [e["metrics"] for e in read_events(out / "events.jsonl") if e["event"] == "step"]


def test_a_consistency_stage_trains_the_student_and_keeps_the_teacher(make_trainer, tmp_path):
    trainer = make_trainer(
        tmp_path, cls=ConsistencyTrainer, init_from=INIT, callbacks=EMA, max_steps=3, teacher_steps=4, log_every=1
    )
    before = _trainable(trainer)
    trainer.start()
    teacher = trainer.adapter.snapshots.state_dict(TEACHER)
    assert all(torch.equal(teacher[k], before[k]) for k in before)
    after = _trainable(trainer)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    metrics = _step_metrics(tmp_path)
    assert len(metrics) == 3 and all(m["loss"] > 0 and torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
