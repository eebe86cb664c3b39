"""A GRPO stage trains on a reward of an installed plugin, named by its entry point, with its options."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_site import install_example_plugin, on_path

from flowpost.core.events import read_events
from flowpost.core.trainers.rl.grpo import GRPOTrainer


def test_a_grpo_stage_trains_on_the_example_plugin_reward(make_trainer, tmp_path: Path, monkeypatch) -> None:
    with on_path(install_example_plugin(tmp_path / "site"), monkeypatch):
        trainer = make_trainer(
            tmp_path / "out",
            cls=GRPOTrainer,
            rewards=[{"name": "contrast", "options": {"target": 0.0}}],  # minus the RMS contrast
            sampling={"steps": 3},
            iterations=2,
            log_every=1,
            prompts_per_iteration=2,
            group_size=4,
            rollout_batch_size=8,
            train_batch_size=4,
        )
        trainer.start()
    steps = [
        event["metrics"] for event in read_events(tmp_path / "out" / "events.jsonl") if event["event"] == "progress"
    ]
    assert len(steps) == 2
    for metrics in steps:
        assert -0.5 <= metrics["reward/contrast_mean"] < 0
        assert metrics["reward/total_mean"] == pytest.approx(metrics["reward/contrast_mean"])
