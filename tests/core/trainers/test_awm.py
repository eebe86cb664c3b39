"""AWM: weightings and timestep strata against closed forms, on-policy ratios, update direction, anchor, runs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from flowpost.core.trainers.rl.awm import AWMTrainer, anchor_decay, stratified_step_indices, weighted_error
from flowpost.core.trainers.rl.grpo import ppo_clip_loss
from flowpost.errors import FlowpostError

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {
    "prompts_per_iteration": 2,
    "group_size": 4,
    "rollout_batch_size": 8,
    "train_batch_size": 4,
    "train_timesteps": 2,
    "sampling": {"steps": 4},
    "rewards": JPEG,
}


def test_each_weighting_matches_its_closed_form():
    error, sigma = torch.tensor([0.16, 0.0], dtype=torch.float64), torch.tensor([0.5, 0.8], dtype=torch.float64)
    expected = {
        "uniform": [0.16, 0.0],
        "t": [0.08, 0.0],
        "t2": [0.04, 0.0],
        "huber": [0.5 * (math.sqrt(0.16 + 1e-10) - 1e-5), 0.8 * (1e-5 - 1e-5)],
        "ghuber": [0.5 / 0.25 * ((0.16 + 1e-10) ** 0.25 - 1e-10**0.25), 0.0],
    }
    for name, values in expected.items():
        torch.testing.assert_close(weighted_error(error, sigma, name), torch.tensor(values, dtype=torch.float64))
    half = weighted_error(error, sigma, "ghuber", power=0.5)
    torch.testing.assert_close(half[0], torch.tensor(0.5 / 0.5 * (math.sqrt(0.16 + 1e-10) - 1e-5), dtype=torch.float64))


def test_strata_cover_the_sampling_steps_without_the_pure_noise_step():
    low = stratified_step_indices(torch.zeros(1, 6), 14, 0.9)
    high = stratified_step_indices(torch.full((1, 6), 1 - 1e-7), 14, 0.9)
    assert low.tolist() == [[1, 2, 4, 6, 8, 10]] and high.tolist() == [[1, 3, 5, 7, 9, 11]]
    draws = stratified_step_indices(torch.rand(1000, 3, generator=torch.Generator().manual_seed(0)), 10, 0.9)
    assert draws.min() == 1 and draws.max() == 8 and (draws.diff(dim=1) > 0).all()


@pytest.mark.parametrize("weighting", ["uniform", "t"])
def test_at_the_on_policy_point_the_gradient_is_the_advantage_weighted_matching_gradient(weighting):
    error = torch.tensor([0.3, 0.5, 0.2], dtype=torch.float64, requires_grad=True)
    sigma = torch.tensor([0.9, 0.4, 0.6], dtype=torch.float64)
    advantages = torch.tensor([1.0, -0.5, 0.0], dtype=torch.float64)
    log_prob = -weighted_error(error, sigma, weighting)
    ppo_clip_loss(log_prob, log_prob.detach(), advantages, clip_range=1e-3).backward()
    scale = sigma if weighting == "t" else torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(error.grad, advantages * scale / 3)  # dL/dl = A * w'(l) / N: A > 0 lowers l


def test_anchor_decay_ramps_then_saturates():
    assert [anchor_decay(k, ramp=0.001, max_decay=0.3) for k in (0, 100, 300, 5000)] == [0.0, 0.1, 0.3, 0.3]


def test_the_first_micro_batch_is_exactly_on_policy_and_later_ones_are_not(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=AWMTrainer, **SMALL)
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    metrics = trainer.optimize(rollout)
    assert sorted(trainer.old_log_probs) == list(range(8))
    assert metrics["on_policy_ratio_error"] == 0.0
    assert metrics["ratio_deviation"] > 0  # the second micro-batch follows one update


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_positive_advantage_lowers_the_matching_error_and_a_negative_one_raises_it(make_trainer, tmp_path, sign):
    trainer = make_trainer(tmp_path, cls=AWMTrainer, weighting="uniform", lr=1e-4, **{**SMALL, "train_batch_size": 8})
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    rollout.advantages = torch.full((8,), sign * trainer.args.advantage_clip)
    before = torch.stack(list(trainer.sampling_log_probs(rollout).values()))  # -l at the training points
    trainer.optimize(rollout)
    after = torch.stack(list(trainer.sampling_log_probs(rollout).values()))
    assert trainer.progress.optimizer_step == 1
    assert sign * float((after - before).mean()) > 0


def test_the_anchor_follows_the_decay_schedule_once_per_iteration(make_trainer, fresh_weights, tmp_path):
    trainer = make_trainer(
        tmp_path, cls=AWMTrainer, iterations=1, ema_kl_beta=0.5, ema_anchor_ramp=0.1, ema_anchor_decay=0.3, **SMALL
    )
    trainer.start()  # 2 optimizer steps: d = min(0.3, 0.2)
    anchor, live = trainer.adapter.snapshots.state_dict("anchor"), dict(trainer.adapter.module().named_parameters())
    for key, value in anchor.items():
        torch.testing.assert_close(value, 0.2 * fresh_weights[key] + 0.8 * live[key].detach())
    previous = {key: value.clone() for key, value in anchor.items()}
    trainer.progress = dataclasses.replace(trainer.progress, optimizer_step=10)
    trainer._after_acquisition_cycle()  # d = min(0.3, 1.0)
    for key, value in trainer.adapter.snapshots.state_dict("anchor").items():
        torch.testing.assert_close(value, 0.3 * previous[key] + 0.7 * live[key].detach())


@pytest.mark.parametrize("lora_rank", [None, 4])
def test_a_short_stage_changes_the_weights_and_stays_finite(make_trainer, tmp_path, lora_rank):
    from flowpost.core.events import read_events

    trainer = make_trainer(
        tmp_path, cls=AWMTrainer, lora_rank=lora_rank, iterations=2, kl_beta=0.1, ema_kl_beta=0.1, log_every=1, **SMALL
    )
    before = {k: v.clone() for k, v in trainer.adapter.module().state_dict().items()}
    progress = trainer.start()
    after = trainer.adapter.module().state_dict()
    assert (progress.rollout_iteration, progress.optimizer_step) == (2, 4)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(torch.isfinite(v).all() for v in after.values())
    if lora_rank is not None:
        assert all("lora_" in k for k in changed)
    assert trainer.adapter.snapshots.names() == ["anchor", "ref"]
    metrics = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "progress"][-1]["metrics"]
    assert {"policy_loss", "kl", "ema_kl", "clip_fraction", "on_policy_ratio_error"} <= set(metrics)
    assert metrics["kl"] > 0 and metrics["on_policy_ratio_error"] == 0.0


def test_a_resumed_stage_ends_with_identical_weights_and_snapshots(make_trainer, tmp_path):
    from flowpost.core.events import read_events

    settings = {"iterations": 2, "kl_beta": 0.1, "ema_kl_beta": 0.1, "ema_anchor_ramp": 0.1, **SMALL}
    straight = make_trainer(tmp_path / "straight", cls=AWMTrainer, resume=False, **settings)
    straight.start()
    make_trainer(tmp_path / "resumed", cls=AWMTrainer, **{**settings, "iterations": 1}).start()
    resumed = make_trainer(tmp_path / "resumed", cls=AWMTrainer, **settings)
    assert resumed.start().rollout_iteration == 2
    starts = [e for e in read_events(tmp_path / "resumed" / "events.jsonl") if e["event"] == "start"]
    assert starts[-1]["resumed_from"] is not None
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    anchor_a, anchor_b = (t.adapter.snapshots.state_dict("anchor") for t in (straight, resumed))
    assert all(torch.equal(anchor_a[k], anchor_b[k]) for k in anchor_a)


def test_more_train_timesteps_than_sampling_steps_is_a_config_error(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match="train_timesteps"):
        make_trainer(tmp_path, cls=AWMTrainer, **{**SMALL, "train_timesteps": 3})
