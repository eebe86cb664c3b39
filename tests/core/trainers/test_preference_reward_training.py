"""GRPO trains on the preference rewards: one tiny-sd3 iteration each with hpsv2, imagereward and aesthetic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_clip import PROJECTION, build_tiny_clip
from tiny_image_reward import build_tiny_image_reward
from tiny_open_clip import build_tiny_open_clip

from flowpost.core.events import read_events
from flowpost.core.rewards.aesthetic import aesthetic_mlp
from flowpost.core.trainers.rl.grpo import GRPOTrainer

SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


def _reward_options(name: str, folder: Path) -> dict[str, str]:
    if name == "aesthetic":  # a tiny random CLIP and random predictor weights under the released file's keys
        folder.mkdir(parents=True)
        torch.manual_seed(1)
        state = {f"layers.{key}": value for key, value in aesthetic_mlp(PROJECTION).state_dict().items()}
        torch.save(state, folder / "aesthetic.pth")
        return {"weights": str(folder / "aesthetic.pth"), "model": str(build_tiny_clip(folder / "clip"))}
    if name == "hpsv2":
        files = build_tiny_open_clip(folder)
        return {
            "checkpoint": str(files["checkpoint"]),
            "model": str(files["config"]),
            "tokenizer": str(files["tokenizer"]),
        }
    files = build_tiny_image_reward(folder)
    return {"checkpoint": str(files["checkpoint"]), "tokenizer": str(files["tokenizer"])}


@pytest.mark.parametrize("name", ["hpsv2", "imagereward", "aesthetic"])
def test_one_grpo_iteration_on_the_reward(make_trainer, tmp_path: Path, name: str) -> None:
    rewards = [{"name": name, "options": _reward_options(name, tmp_path / "reward")}]
    trainer = make_trainer(
        tmp_path / "run", cls=GRPOTrainer, rewards=rewards, sampling={"steps": 2}, iterations=1, log_every=1, **SMALL
    )
    before = {key: value.clone() for key, value in trainer.adapter.module().state_dict().items()}
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    (step,) = [event for event in read_events(tmp_path / "run" / "events.jsonl") if event["event"] == "progress"]
    metrics = step["metrics"]
    assert metrics[f"reward/{name}_mean"] == pytest.approx(metrics["reward/total_mean"])
    assert metrics[f"reward/{name}_std"] > 0  # eight different images scored differently
    after = trainer.adapter.module().state_dict()
    assert any(not torch.equal(before[key], after[key]) for key in before)
