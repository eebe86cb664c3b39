"""Online DPO: the preference losses, pair selection by group id, the margin at θ = ref, tiny stages."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.trainers.objective import to_host
from flowpost.core.trainers.preference import group_pairs, implicit_accuracy, preference_loss, preference_margin
from flowpost.core.trainers.rl.online_dpo import OnlineDPOTrainer, preference_pairs
from flowpost.core.trainers.rl.rollout import Rollout

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 1}


def test_losses_match_a_hand_computation_and_descent_favours_the_chosen_sample():
    errors = torch.tensor([0.30, 0.50], requires_grad=True)  # policy: chosen, rejected
    margin = preference_margin(errors[0], errors[1], torch.tensor(0.35), torch.tensor(0.45))
    assert float(margin.detach()) == pytest.approx(0.1)  # (0.35 - 0.45) - (0.30 - 0.50)
    loss = preference_loss(margin, beta=20.0)
    assert float(loss.detach()) == pytest.approx(math.log1p(math.exp(-1.0)))  # -log sigmoid(20 / 2 * 0.1)
    loss.backward()
    assert errors.grad[0] > 0 > errors.grad[1]  # descent lowers the chosen error, raises the rejected one
    z = torch.tensor([0.1, 0.3])
    assert preference_loss(z, beta=10.0, loss_type="hinge").tolist() == pytest.approx([0.5, 0.0])  # max(0, 1 - 5z)
    assert preference_loss(z, beta=10.0, loss_type="ipo").tolist() == pytest.approx([0.0, 0.04])  # (z - 1/10)^2
    assert float(implicit_accuracy(torch.tensor([1.0, -1.0, 0.0, 2.0]))) == pytest.approx(0.625)


def test_pairs_are_argmax_and_argmin_per_group_id_even_when_prompts_repeat():
    group_ids = torch.tensor([7, 7, 7, 9, 9, 9, 4, 4, 4])
    rewards = torch.tensor([0.2, 0.9, 0.1, 0.5, 0.3, 0.8, 0.6, 0.6, 0.6])
    prompts = ["digit 3"] * 6 + ["digit 5"] * 3  # groups 7 and 9 share a prompt string
    rollout = Rollout(
        prompts=prompts,
        metadata=[{} for _ in prompts],
        group_ids=group_ids,
        indices=torch.arange(9) + 100,
        conditions=ConditionBatch(torch.zeros(9, 2, 4), torch.ones(9, 2), torch.zeros(9, 4)),
        final=torch.arange(9.0).view(9, 1, 1, 1),
        steps=torch.zeros(0, dtype=torch.long),
        sigmas=torch.zeros(0),
        sigmas_next=torch.zeros(0),
        rewards=rewards,
    )
    pairs = preference_pairs(rollout)
    assert pairs.indices.tolist() == [101, 105, 106]  # chosen: argmax of each group, in order of appearance
    assert pairs.rejected.flatten().tolist() == [2.0, 4.0, 6.0]  # rejected: argmin; a tie-only group repeats its row
    assert pairs.valid.tolist() == [True, True, False]  # all-equal rewards: no preference, zero weight
    assert (pairs.rewards - pairs.rejected_rewards).tolist() == pytest.approx([0.8, 0.5, 0.0])
    assert group_pairs(torch.tensor([1.0]), torch.tensor([3]))[2].tolist() == [False]


@pytest.mark.parametrize("lora_rank", [None, 4])
def test_margin_is_zero_at_the_reference_and_one_step_raises_it(make_trainer, tmp_path, lora_rank):
    trainer = make_trainer(
        tmp_path, cls=OnlineDPOTrainer, rewards=JPEG, sampling={"steps": 3}, lora_rank=lora_rank, lr=1e-4, **SMALL
    )
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    pairs = preference_pairs(rollout)
    assert pairs.valid.all() and len(pairs) == 2
    errors, ref_errors, kl = trainer.pair_errors(pairs, 0)
    assert torch.equal(errors.detach(), ref_errors) and float(kl.detach().abs().max()) == 0.0
    metrics, _ = to_host(trainer.backpropagate(trainer.pair_loss(pairs, scale=1.0)))
    assert metrics["loss"] == pytest.approx(math.log(2.0)) and metrics["implicit_accuracy"] == 0.5
    assert metrics["margin"] == 0.0 and metrics["reward_margin"] > 0
    trainer.step_optimizer({})
    errors, ref_errors, _ = trainer.pair_errors(pairs, 0)
    margin = preference_margin(errors[0], errors[1], ref_errors[0], ref_errors[1]).detach()
    assert (margin > 0).all()  # the same noise and sigma: chosen error fell relative to the rejected one


@pytest.mark.parametrize("lora_rank", [None, 4])
def test_a_stage_changes_the_weights_and_keeps_the_frozen_reference(make_trainer, tmp_path, lora_rank):
    trainer = make_trainer(
        tmp_path, cls=OnlineDPOTrainer, rewards=JPEG, sampling={"steps": 3}, lora_rank=lora_rank, iterations=2, **SMALL
    )
    initial = {k: v.clone() for k, v in trainer.adapter.snapshots.state_dict("ref").items()}
    assert (trainer.start().rollout_iteration, trainer.progress.optimizer_step) == (2, 4)
    live = dict(trainer.adapter.module().named_parameters())
    assert all(torch.isfinite(live[k]).all() for k in initial)
    assert any(not torch.equal(live[k].detach(), initial[k]) for k in initial)
    ref = trainer.adapter.snapshots.state_dict("ref")
    assert all(torch.equal(ref[k], initial[k]) for k in initial)
    if lora_rank:
        assert initial and all("lora_" in k for k in initial)


def test_the_reference_is_copied_from_the_policy_once_per_multiple_of_ref_update_every(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=OnlineDPOTrainer, rewards=JPEG, ref_update_every=3, **SMALL)
    params = dict(trainer.adapter.module().named_parameters())
    key = next(iter(trainer.adapter.snapshots.state_dict("ref")))

    def bump_and_refresh(step: int) -> bool:
        """Move the live weights, refresh at ``step``; True when ``ref`` now equals the live weights."""
        with torch.no_grad():
            params[key].add_(1.0)
        trainer.progress = dataclasses.replace(trainer.progress, optimizer_step=step)
        trainer.refresh_reference()
        return torch.equal(trainer.adapter.snapshots.state_dict("ref")[key], params[key].detach())

    assert [bump_and_refresh(step) for step in (0, 2, 3, 3, 4, 6)] == [False, False, True, False, False, True]


def test_a_stage_with_a_moving_reference_resumes_bit_identically(make_trainer, tmp_path):
    settings = {"rewards": JPEG, "sampling": {"steps": 3}, "iterations": 2, "ref_update_every": 3, **SMALL}
    straight = make_trainer(tmp_path / "straight", cls=OnlineDPOTrainer, resume=False, **settings)
    initial = {k: v.clone() for k, v in straight.adapter.snapshots.state_dict("ref").items()}
    straight.start()
    ref = straight.adapter.snapshots.state_dict("ref")
    live = dict(straight.adapter.module().named_parameters())
    assert any(not torch.equal(ref[k], initial[k]) for k in ref)  # copied after optimizer step 3
    assert any(not torch.equal(ref[k], live[k].detach()) for k in ref)  # step 4 came after the copy

    first = make_trainer(
        tmp_path / "resumed", cls=OnlineDPOTrainer, checkpoint_every=1, **{**settings, "iterations": 1}
    )
    first.start()
    resumed = make_trainer(tmp_path / "resumed", cls=OnlineDPOTrainer, checkpoint_every=1, **settings)
    resumed.start()
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(ref[k], resumed.adapter.snapshots.state_dict("ref")[k]) for k in ref)
