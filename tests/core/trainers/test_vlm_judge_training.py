"""A GRPO iteration of the tiny family rewarded by a tiny random vision-language judge: pointwise (``vlm_judge``) and
pairwise within each rollout group (``vlm_pairwise_judge``), which the rollout engine hands whole groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_vlm import build_tiny_vlm

from flowpost.core.events import read_events
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.errors import FlowpostError

GROUPS = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 2, "train_batch_size": 4}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("vlm")))


def test_a_grpo_iteration_trains_on_the_judges(make_trainer, vlm: str, tmp_path: Path) -> None:
    rewards = [
        {"name": "vlm_judge", "options": {"model": vlm}},
        {"name": "vlm_pairwise_judge", "options": {"model": vlm}},
    ]
    trainer = make_trainer(
        tmp_path / "out", cls=GRPOTrainer, rewards=rewards, sampling={"steps": 3}, iterations=1, log_every=1, **GROUPS
    )
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    # forward batches of 2 split each group of 4, yet the pairwise judge saw whole groups: its scores are the
    # judge's on each group's four decoded images at once, and each group's win rates sum to 4 / 2
    (pointwise, _), (pairwise, _) = trainer.rollouts.rewards.components  # both weighted 1
    images = trainer.adapter.decode(rollout.final).cpu()
    scored = rollout.rewards - pointwise(images, rollout.prompts, rollout.metadata)
    for group in rollout.group_ids.unique():
        rows = (rollout.group_ids == group).nonzero().flatten().tolist()
        direct = pairwise(images[rows], [rollout.prompts[r] for r in rows], [rollout.metadata[r] for r in rows])
        torch.testing.assert_close(scored[rows], direct, atol=1e-4, rtol=0)
        assert float(direct.sum()) == pytest.approx(2.0)
    before = {name: p.detach().clone() for name, p in trainer.adapter.module().named_parameters() if p.requires_grad}
    trainer.start()
    (metrics,) = [e["metrics"] for e in read_events(tmp_path / "out" / "events.jsonl") if e["event"] == "progress"]
    assert 0 <= metrics["reward/vlm_judge_mean"] <= 1  # the tiny judge says yes to most of these digits
    assert (
        metrics["reward/vlm_pairwise_judge_mean"] == pytest.approx(0.5) and metrics["reward/vlm_pairwise_judge_std"] > 0
    )
    assert metrics["advantage/advantage_abs_mean"] > 0
    after = dict(trainer.adapter.module().named_parameters())
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_overlapped_scoring_refuses_a_reward_comparing_groups(make_trainer, vlm: str, tmp_path: Path) -> None:
    rewards = [{"name": "vlm_pairwise_judge", "options": {"model": vlm}}]
    with pytest.raises(FlowpostError, match=r"train\.overlap_rewards: .*compares whole groups"):
        make_trainer(tmp_path / "out", cls=GRPOTrainer, rewards=rewards, overlap_rewards=True, **GROUPS)
