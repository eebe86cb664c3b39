"""CRD: the implicit reward and the centred loss against hand computations, the cancellation of a group constant,
the snapshot schedules, config errors, one iteration on the tiny family, resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.trainers.rl.crd import (
    CRDTrainer,
    centred_reward_loss,
    centring_weights,
    group_softmax,
    implicit_reward,
    kl_weights,
    snapshot_decay,
)
from flowpost.errors import FlowpostError

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {
    "prompts_per_iteration": 2,
    "group_size": 4,
    "rollout_batch_size": 8,
    "train_batch_size": 4,
    "train_timesteps": 2,
    "kl_guidance": 1.0,
    "rewards": JPEG,
    "sampling": {"dynamics": "ode", "steps": 4},
}
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])


def _toy(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    implicit = torch.randn(6, generator=generator, dtype=torch.float64) * 0.1
    r = torch.rand(6, generator=generator, dtype=torch.float64)
    return implicit, r


def test_the_implicit_reward_is_the_drop_of_the_matching_error_from_the_old_copy():
    generator = torch.Generator().manual_seed(0)
    v, v_old, target = (torch.randn(2, 3, 4, 4, generator=generator) for _ in range(3))
    plain = implicit_reward(v, v_old, target, adaptive=False)
    expected = -((v - target) ** 2 - (v_old - target) ** 2).flatten(1).mean(1)
    torch.testing.assert_close(plain, expected)
    adaptive = implicit_reward(v, v_old, target, adaptive=True)
    w, w_old = (v - target).abs().flatten(1).mean(1), (v_old - target).abs().flatten(1).mean(1)
    expected = -(((v - target) ** 2).flatten(1).mean(1) / w - ((v_old - target) ** 2).flatten(1).mean(1) / w_old)
    torch.testing.assert_close(adaptive, expected)
    assert torch.equal(implicit_reward(v, v, target, adaptive=True), torch.zeros(2))  # live == old: no reward


def test_the_adaptive_weight_takes_no_gradient():
    generator = torch.Generator().manual_seed(1)
    v, v_old, target = (torch.randn(1, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    live = v.clone().requires_grad_(True)
    implicit_reward(live, v_old, target, adaptive=True).sum().backward()
    w = (v - target).abs().mean()
    torch.testing.assert_close(live.grad, -2 * (v - target) / (8 * w))


def test_the_uniform_loss_regresses_the_centred_implicit_reward_onto_the_centred_reward():
    implicit, r = _toy()
    beta = 2.0
    loss = centred_reward_loss(implicit, r, GROUPS, 2, beta=beta)
    expected = []
    for rows in (slice(0, 3), slice(3, 6)):
        q_c, r_c = implicit[rows] - implicit[rows].mean(), r[rows] - r[rows].mean()
        expected.append((beta * q_c - r_c) ** 2)
    torch.testing.assert_close(loss, torch.cat(expected).mean())
    bce = centred_reward_loss(implicit, r, GROUPS, 2, beta=beta, loss_type="bce")
    logits = torch.cat([beta * (implicit[s] - implicit[s].mean()) for s in (slice(0, 3), slice(3, 6))])
    targets = torch.cat([r[s] - r[s].mean() for s in (slice(0, 3), slice(3, 6))])
    torch.testing.assert_close(bce, F.binary_cross_entropy_with_logits(logits, torch.sigmoid(targets)))


@pytest.mark.parametrize("temperature", [-1.0, 0.0, 0.5])
def test_a_constant_per_group_cancels_in_the_loss_and_its_gradient(temperature):
    implicit, r = _toy(2)
    live = implicit.clone().requires_grad_(True)
    loss = centred_reward_loss(live, r, GROUPS, 2, beta=3.0, temperature=temperature)
    loss.backward()
    shifted = (implicit + torch.tensor([5.0, 5.0, 5.0, -2.0, -2.0, -2.0], dtype=torch.float64)).requires_grad_(True)
    r_shift = 0.0 if temperature == 0 else 0.3  # the hard split is at r = 1/2: a shift of r moves it
    moved = centred_reward_loss(shifted, r + r_shift, GROUPS, 2, beta=3.0, temperature=temperature)
    moved.backward()
    torch.testing.assert_close(moved, loss)
    torch.testing.assert_close(shifted.grad, live.grad)


def test_the_loss_vanishes_where_the_implicit_reward_matches_the_centred_reward():
    _, r = _toy(3)
    live = (r / 4.0).clone().requires_grad_(True)  # beta q = r: equal after centring
    loss = centred_reward_loss(live, r, GROUPS, 2, beta=4.0)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-20)
    assert live.grad.abs().max() == 0


def test_centring_weights_by_temperature():
    r = torch.tensor([0.9, 0.2, 0.5, 0.7, 0.6, 0.8])
    (uniform,) = centring_weights(r, GROUPS, 2, -1.0)
    torch.testing.assert_close(uniform, torch.full((6,), 1 / 3))
    plus, minus = centring_weights(r, GROUPS, 2, 0.0)
    torch.testing.assert_close(plus, torch.tensor([1.0, 0, 0, 1 / 3, 1 / 3, 1 / 3]))
    torch.testing.assert_close(minus, torch.tensor([0, 1.0, 0, 1 / 3, 1 / 3, 1 / 3]))  # group 1 has no r < 0.5
    plus, minus = centring_weights(r, GROUPS, 2, 0.5)
    torch.testing.assert_close(plus[:3], torch.softmax(r[:3] / 0.5, 0))
    torch.testing.assert_close(minus[3:], torch.softmax(-r[3:] / 0.5, 0))
    torch.testing.assert_close(group_softmax(torch.full((6,), float("-inf")), GROUPS, 2), torch.full((6,), 1 / 3))


def test_snapshot_decay_and_kl_weights():
    assert [snapshot_decay(k, (0, 0.25, 0.005, 0.999)) for k in (0, 10, 200)] == pytest.approx([0.25, 0.3, 0.999])
    assert [snapshot_decay(k, (75, 0.0, 0.0075, 0.999)) for k in (0, 74, 75, 100, 500)] == pytest.approx(
        [0, 0, 0, 0.1875, 0.999]
    )
    r = torch.tensor([0.0, 0.5, 1.0])
    torch.testing.assert_close(
        kl_weights(r, kl_beta=0.1, floor=1e-4, adaptive=True), torch.tensor([1e-4, 0.05005, 0.1])
    )
    torch.testing.assert_close(kl_weights(r, kl_beta=0.1, floor=1e-4, adaptive=False), torch.full((3,), 0.1))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_batch_size": 6}, "train_batch_size \\(6\\) must be a multiple of group_size \\(4\\)"),
        ({"kl_floor": 0.5}, "kl_floor \\(0.5\\) exceeds kl_beta \\(0.1\\)"),
        ({"old_decay": [0, 1.5, 0.0, 1.0]}, "d0, d1 in \\[0, 1\\]"),
    ],
)
def test_settings_it_cannot_run_with_are_refused_at_validate_time(change, message):
    stage = {
        "trainer": "crd",
        "model": {"family": "tiny-sd3", "init": "scratch"},
        "data": {"dataset": "digits", "conditions": "c"},
        "sampling": {"dynamics": "ode"},
        "rewards": JPEG,
        "train": {"group_size": 4, "train_batch_size": 8},
    }
    pipeline = {
        "name": "p",
        "datasets": {"digits": {"source": "builtin-digits"}},
        "conditions": {"c": {"encoder": "minilm", "datasets": ["digits"]}},
        "stages": {"crd": stage},
    }
    validate_pipeline(pipeline)
    stage["train"].update(change)
    with pytest.raises(FlowpostError, match=rf"stages\.crd\.train.*{message}"):
        validate_pipeline(pipeline)


def test_a_group_shares_its_sigmas_and_each_row_draws_its_noise(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=CRDTrainer, **SMALL)
    rollout = trainer.sample()
    sigmas, noise = trainer.training_points(rollout)
    assert sigmas.shape == (8, 2) and noise.shape == (2, *rollout.final.shape)
    for rows in (slice(0, 4), slice(4, 8)):
        assert (sigmas[rows] == sigmas[rows][0]).all()
    assert not torch.equal(noise[:, 0], noise[:, 1])
    assert set(sigmas.flatten().tolist()) <= set(trainer.sigma_table[:-1].tolist())
    torch.testing.assert_close(trainer.training_points(rollout.select([6, 1]))[1], noise[:, [6, 1]], rtol=0, atol=0)
    batch = rollout.select([0, 1, 2, 3])
    batch.final = batch.final.double()
    sigmas, noise = trainer.training_points(batch)
    assert {sigmas.dtype, noise.dtype} == {torch.float64}
    assert sigmas.device == noise.device == trainer.accelerator.device


def test_a_stage_trains_moves_old_and_sampler_by_their_schedules_and_keeps_the_reference(make_trainer, tmp_path):
    from flowpost.core.events import read_events

    settings = {**SMALL, "old_decay": [0, 0.25, 0.0, 0.25], "sampler_decay": [0, 0.5, 0.0, 0.5], "kl_guidance": 3.0}
    trainer = make_trainer(tmp_path, cls=CRDTrainer, iterations=1, log_every=1, **settings)
    module, snapshots = trainer.adapter.module(), trainer.adapter.snapshots
    initial = {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}
    assert set(snapshots.names()) == {"ref", "old", "sampler"}
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    live = {k: p.detach() for k, p in module.named_parameters() if p.requires_grad}
    assert any(not torch.equal(initial[k], live[k]) for k in live)
    for name, decay in (("old", 0.25), ("sampler", 0.5)):
        for key, value in snapshots.state_dict(name).items():
            torch.testing.assert_close(value, decay * initial[key] + (1 - decay) * live[key])
    assert all(torch.equal(value, initial[key]) for key, value in snapshots.state_dict("ref").items())
    metrics = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "progress"][-1]["metrics"]
    assert {"loss", "policy_loss", "kl", "kl_loss", "implicit_reward", "old_decay", "sampler_decay"} <= set(metrics)
    assert metrics["kl"] > 0 and metrics["old_decay"] == pytest.approx(0.25)


def test_rollouts_sample_with_the_sampler_copy(make_trainer, tmp_path):
    settings = {**SMALL, "sampler_decay": [0, 0.9, 0.0, 0.9]}
    trainer = make_trainer(tmp_path, cls=CRDTrainer, iterations=1, **settings)
    trainer.start()
    with trainer.adapter.use_snapshot("sampler"):
        by_sampler = trainer.generate().final
    assert torch.equal(trainer.sample().final, by_sampler)
    assert not torch.equal(by_sampler, trainer.generate().final)


def test_a_crd_stage_resumes_to_identical_weights_and_snapshots(make_trainer, tmp_path):
    settings = {**SMALL, "iterations": 2, "inner_epochs": 2, "sampler_decay": [0, 0.5, 0.0, 0.5]}
    straight = make_trainer(tmp_path / "straight", cls=CRDTrainer, resume=False, **settings)
    straight.start()
    make_trainer(tmp_path / "resumed", cls=CRDTrainer, checkpoint_every=1, **{**settings, "iterations": 1}).start()
    resumed = make_trainer(tmp_path / "resumed", cls=CRDTrainer, checkpoint_every=1, **settings)
    resumed.start()
    assert resumed.progress == straight.progress
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for name in ("old", "sampler"):
        snap_a, snap_b = straight.adapter.snapshots.state_dict(name), resumed.adapter.snapshots.state_dict(name)
        assert all(torch.equal(snap_a[k], snap_b[k]) for k in snap_a)
