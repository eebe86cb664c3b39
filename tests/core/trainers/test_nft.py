"""DiffusionNFT: gradient directions against hand derivations, the old policy, full tiny stages, resume."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.sampling.schedules import inference_sigmas
from flowpost.core.trainers.rl.nft import NFTTrainer, nft_loss, old_decay, optimality_weights

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


def _toy(seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    x0, noise, v_old = (torch.randn(3, 1, 4, 4, generator=generator) for _ in range(3))
    sigma = torch.tensor([0.3, 0.6, 0.9])
    x_t = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * noise
    return x0, noise, v_old, sigma, x_t


def _x0_error(velocity: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return (x_t - sigma.view(-1, 1, 1, 1) * velocity - x0).pow(2).flatten(1).mean(1)


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_a_positive_sample_pulls_the_velocity_to_its_data(beta):
    x0, noise, v_old, sigma, x_t = _toy()
    target = noise - x0
    velocity = v_old.clone().requires_grad_(True)
    nft_loss(velocity, v_old, x_t, x0, sigma, torch.ones(3), beta=beta).sum().backward()
    # r = 1: loss = <t^2 (u - v+)^2> / (beta w+), v+ = v at v = v_old, w+ = t <|u - v|>
    t = sigma.view(-1, 1, 1, 1)
    weight = (t * (target - v_old)).abs().flatten(1).mean(1).view(-1, 1, 1, 1)
    expected = -2 * t**2 * (target - v_old) / (16 * weight)
    torch.testing.assert_close(velocity.grad, expected, rtol=1e-5, atol=1e-7)
    stepped = v_old - 0.1 * velocity.grad
    assert (_x0_error(stepped, x_t, x0, sigma) < _x0_error(v_old, x_t, x0, sigma)).all()
    assert ((stepped - v_old) * (target - v_old)).flatten(1).sum(1).gt(0).all()


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_a_negative_sample_pushes_the_velocity_past_the_old_policy_away_from_its_data(beta):
    x0, noise, v_old, sigma, x_t = _toy(1)
    target = noise - x0
    velocity = (v_old + 0.05).requires_grad_(True)
    nft_loss(velocity, v_old, x_t, x0, sigma, torch.zeros(3), beta=beta).sum().backward()
    # r = 0: loss = <t^2 (u - v-)^2> / (beta w-), v- = (1 + beta) v_old - beta v, dv-/dv = -beta
    negative = (1 + beta) * v_old - beta * velocity.detach()
    t = sigma.view(-1, 1, 1, 1)
    weight = (t * (target - negative)).abs().flatten(1).mean(1).view(-1, 1, 1, 1)
    expected = 2 * t**2 * (target - negative) / (16 * weight)
    torch.testing.assert_close(velocity.grad, expected, rtol=1e-5, atol=1e-7)
    stepped = velocity.detach() - 0.05 * velocity.grad
    stepped_negative = (1 + beta) * v_old - beta * stepped
    assert (_x0_error(stepped_negative, x_t, x0, sigma) < _x0_error(negative, x_t, x0, sigma)).all()
    assert ((stepped - velocity.detach()) * (target - negative)).flatten(1).sum(1).lt(0).all()


def test_a_neutral_sample_with_an_unchanged_policy_gives_no_gradient():
    x0, _, v_old, sigma, x_t = _toy(2)
    velocity = v_old.clone().requires_grad_(True)
    nft_loss(velocity, v_old, x_t, x0, sigma, torch.full((3,), 0.5), beta=1.0).sum().backward()
    assert velocity.grad.abs().max() < 1e-7


def test_optimality_weights_map_the_clipped_advantage_to_the_unit_interval():
    advantages = torch.tensor([-7.0, -5.0, -1.0, 0.0, 2.5, 5.0, 9.0])
    assert optimality_weights(advantages, 5.0).tolist() == pytest.approx([0, 0, 0.4, 0.5, 0.75, 1, 1])
    assert optimality_weights(advantages, 5.0, "positive_only").tolist() == pytest.approx([0.5] * 4 + [0.75, 1, 1])
    assert optimality_weights(advantages, 5.0, "negative_only").tolist() == pytest.approx([0, 0, 0.4] + [0.5] * 4)
    assert optimality_weights(advantages, 5.0, "one_only").tolist() == pytest.approx([0.5] * 4 + [0.6] * 3)
    assert optimality_weights(advantages, 5.0, "binary").tolist() == pytest.approx([0.4] * 3 + [0.5] + [0.6] * 3)


def test_old_policy_decay_schedules():
    assert [old_decay(0, k) for k in (0, 100, 10_000)] == [0.0, 0.0, 0.0]
    assert [old_decay(1, k) for k in (0, 1, 250, 500, 2_000)] == pytest.approx([0, 0.001, 0.25, 0.5, 0.5])
    assert [old_decay(2, k) for k in (0, 74, 75, 76, 175, 1_000)] == pytest.approx([0, 0, 0, 0.0075, 0.75, 0.999])


def test_trained_sigmas_are_a_per_sample_permutation_of_the_sampling_sigmas(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=NFTTrainer, rewards=JPEG, sampling={"steps": 5}, **SMALL)
    rollout = trainer.sample()
    sigmas = trainer.trained_sigmas(rollout)
    schedule = inference_sigmas(5)[:-1]
    assert sigmas.shape == (8, 4)  # int(5 * 0.99) of the 5 nonzero sigmas
    for row in sigmas:
        assert len(set(row.tolist())) == 4 and set(row.tolist()) <= set(schedule.tolist())
    assert len({tuple(row.tolist()) for row in sigmas}) > 1
    torch.testing.assert_close(trainer.trained_sigmas(rollout.select([5, 2])), sigmas[[5, 2]], rtol=0, atol=0)


@pytest.mark.parametrize("lora_rank", [None, 4])
def test_an_nft_stage_trains_and_refreshes_the_old_policy_by_its_decay(make_trainer, tmp_path, lora_rank):
    from flowpost.core.events import read_events

    trainer = make_trainer(
        tmp_path,
        cls=NFTTrainer,
        rewards=JPEG,
        sampling={"dynamics": "ode", "steps": 4},
        lora_rank=lora_rank,
        iterations=1,
        old_decay=1,
        kl_beta=0.1,
        log_every=1,
        **SMALL,
    )
    module = trainer.adapter.module()
    trainable = {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}
    snapshots = trainer.adapter.snapshots
    assert {"old", "ref"} <= set(snapshots.names())
    assert all(torch.equal(snapshots.state_dict("old")[k], v) for k, v in trainable.items())
    optimized = {id(p) for group in trainer.optimizer.optimizer.param_groups for p in group["params"]}
    assert not any(id(t) in optimized or t.requires_grad for t in snapshots.state_dict("old").values())

    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    live = {k: p.detach() for k, p in module.named_parameters() if p.requires_grad}
    assert any(not torch.equal(trainable[k], live[k]) for k in live)
    assert all(torch.isfinite(v).all() for v in live.values())
    decay = 0.002  # min(0.001 k, 0.5) after k = 2 optimizer steps
    for key, value in snapshots.state_dict("old").items():
        torch.testing.assert_close(value, decay * trainable[key] + (1 - decay) * live[key])
    metrics = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "progress"][-1]["metrics"]
    assert {"loss", "nft_loss", "kl", "r_mean", "reward/total_mean"} <= set(metrics)
    assert metrics["old_decay"] == pytest.approx(decay) and metrics["kl"] > 0


def test_an_nft_stage_resumes_to_identical_weights_and_old_policy(make_trainer, tmp_path):
    settings = {
        "rewards": JPEG,
        "sampling": {"dynamics": "flow-sde", "steps": 2},
        "iterations": 2,
        "inner_epochs": 2,
        "kl_beta": 0.0,
        **SMALL,
    }
    straight = make_trainer(tmp_path / "straight", cls=NFTTrainer, resume=False, **settings)
    straight.start()
    make_trainer(tmp_path / "resumed", cls=NFTTrainer, checkpoint_every=1, **{**settings, "iterations": 1}).start()
    resumed = make_trainer(tmp_path / "resumed", cls=NFTTrainer, checkpoint_every=1, **settings)
    resumed.start()
    assert resumed.progress == straight.progress
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    old_a, old_b = straight.adapter.snapshots.state_dict("old"), resumed.adapter.snapshots.state_dict("old")
    assert all(torch.equal(old_a[k], old_b[k]) for k in old_a)
    assert "ref" not in resumed.adapter.snapshots.names()
