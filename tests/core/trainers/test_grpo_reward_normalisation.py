"""``train.reward_normalisation`` in a stage: which advantages a two-reward rollout gets, what is logged, and
which pair online DPO trains on."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.advantages import group_advantages, per_reward_advantages
from flowpost.core.conditions import ConditionBatch
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.online_dpo import preference_pairs
from flowpost.core.trainers.rl.rollout import Rollout

TWO = [{"name": "jpeg_incompressibility"}, {"name": "mean_brightness", "weight": 3.0}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


@pytest.mark.parametrize("normalisation", [None, "sum", "per_reward"])
def test_a_stage_gets_the_advantages_its_setting_names_and_logs_every_reward(
    make_trainer, tmp_path, normalisation: str | None
) -> None:
    setting = {} if normalisation is None else {"reward_normalisation": normalisation}
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, rewards=TWO, sampling={"steps": 3}, **SMALL, **setting)
    rollout = trainer.sample()
    metrics = trainer.rollouts.score(rollout)
    scored = trainer.rollouts.rewards(trainer.adapter.decode(rollout.final).cpu(), rollout.prompts, rollout.metadata)
    jpeg, brightness = scored.components["jpeg_incompressibility"], scored.components["mean_brightness"]
    if normalisation == "per_reward":
        expected = per_reward_advantages([(jpeg, 1.0), (brightness, 3.0)], rollout.group_ids)
    else:
        expected = group_advantages(jpeg + 3.0 * brightness, rollout.group_ids)
    assert torch.equal(rollout.advantages, expected) and rollout.advantages.dtype == torch.float32
    assert torch.equal(rollout.rewards, scored.total)
    assert metrics["reward/mean_brightness_mean"] == pytest.approx(float(brightness.mean()))
    assert metrics["reward/jpeg_incompressibility_mean"] == pytest.approx(float(jpeg.mean()))
    for name in ("jpeg_incompressibility", "mean_brightness"):
        assert -1.0 <= metrics[f"advantage/{name}_corr"] <= 1.0


def test_a_single_reward_logs_no_correlation(make_trainer, tmp_path) -> None:
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, rewards=TWO[:1], sampling={"steps": 3}, **SMALL)
    metrics = trainer.rollouts.score(trainer.sample())
    assert not [key for key in metrics if key.endswith("_corr")]


def test_online_dpo_pairs_on_the_advantages_under_per_reward_normalisation() -> None:
    rollout = Rollout(
        prompts=["a"] * 3,
        metadata=[{}, {}, {}],
        group_ids=torch.tensor([5, 5, 5]),
        indices=torch.arange(3),
        conditions=ConditionBatch(torch.zeros(3, 2, 4), torch.ones(3, 2), torch.zeros(3, 4)),
        final=torch.arange(3.0).view(3, 1, 1, 1),
        steps=torch.zeros(0, dtype=torch.long),
        sigmas=torch.zeros(0),
        sigmas_next=torch.zeros(0),
        rewards=torch.tensor([9.0, 1.0, 5.0]),  # a large-scale reward decides the sum
        advantages=torch.tensor([-1.0, 1.2, -0.2]),  # the decoupled advantage prefers row 1
    )
    by_sum = preference_pairs(rollout)
    assert by_sum.indices.tolist() == [0] and by_sum.rejected.flatten().tolist() == [1.0]
    decoupled = preference_pairs(rollout, ranked_by="advantages")
    assert decoupled.indices.tolist() == [1] and decoupled.rejected.flatten().tolist() == [0.0]
    assert (decoupled.rewards - decoupled.rejected_rewards).tolist() == [-8.0]  # the raw sums, still logged
