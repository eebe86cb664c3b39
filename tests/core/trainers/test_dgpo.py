"""DGPO: the loss against the group Bradley-Terry formula, clipping, group sharing of noise and sigma,
config errors, the old copy's EMA, resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.trainers.rl.dgpo import (
    DGPOTrainer,
    group_preference_loss,
    old_decay,
    stratified_indices,
    trained_step_span,
)
from flowpost.errors import FlowpostError

JPEG = [{"name": "jpeg_incompressibility"}]
ODE = {"dynamics": "ode", "steps": 5}
SMALL = {
    "prompts_per_iteration": 2,
    "group_size": 4,
    "rollout_batch_size": 8,
    "train_batch_size": 4,
    "train_timesteps": 2,
    "rewards": JPEG,
    "sampling": ODE,
}


def _toy(seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    errors = torch.rand(6, generator=generator, dtype=torch.float64) + 0.5
    ref_errors = errors + 0.05 * torch.randn(6, generator=generator, dtype=torch.float64)
    advantages = torch.tensor([1.2, -0.4, -0.8, 0.9, 0.3, -1.2], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    return errors, ref_errors, advantages, groups


def test_the_gradient_is_beta_times_that_of_the_group_bradley_terry_loss():
    errors, ref_errors, advantages, groups = _toy()
    beta, size = 30.0, 3
    live = errors.clone().requires_grad_(True)
    loss, clipped, weights = group_preference_loss(live, ref_errors, advantages, groups, 2, beta=beta, group_size=size)
    loss.backward()
    direct = errors.clone().requires_grad_(True)
    logits = torch.stack(
        [beta / size * (advantages[g] * (direct[g] - ref_errors[g])).sum() for g in (slice(0, 3), slice(3, 6))]
    )
    bradley_terry = -F.logsigmoid(-logits).mean()  # mean over the two groups
    bradley_terry.backward()
    # d/de_i = sigmoid(S_g) beta / G A_i / n_groups = beta * (sigmoid(S_g) A_i / B)
    torch.testing.assert_close(beta * live.grad, direct.grad)
    expected = (torch.sigmoid(logits.detach()).repeat_interleave(3) * advantages * errors).mean()
    torch.testing.assert_close(loss.detach(), expected)
    torch.testing.assert_close(weights, torch.sigmoid(logits.detach()).repeat_interleave(3))
    assert not clipped.any()


def test_the_group_weight_takes_no_gradient_through_the_policy_error():
    errors, ref_errors, advantages, groups = _toy(1)
    live = errors.clone().requires_grad_(True)
    loss, _, weights = group_preference_loss(live, ref_errors, advantages, groups, 2, beta=50.0, group_size=3)
    assert not weights.requires_grad
    loss.backward()
    torch.testing.assert_close(live.grad, weights * advantages / 6)  # d/de of mean(w A e), w constant


def test_at_the_reference_every_group_weight_is_one_half_and_descent_favours_positive_advantages():
    errors, _, advantages, groups = _toy(2)
    live = errors.clone().requires_grad_(True)
    loss, _, weights = group_preference_loss(live, errors, advantages, groups, 2, beta=100.0, group_size=3)
    assert torch.equal(weights, torch.full_like(weights, 0.5))
    loss.backward()
    assert torch.equal(live.grad < 0, advantages < 0)  # descent lowers the error of the preferred samples


def test_the_clip_detaches_errors_that_left_the_range_in_their_advantage_direction():
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    errors = torch.full((6,), 0.5, dtype=torch.float64)
    # ratio exp(e_old - e): above the range (A > 0 clips), below it (A < 0 clips), inside (neither)
    shifts = torch.tensor([0.05, -0.05, -0.05, 0.05, 0.001, -0.001], dtype=torch.float64)
    live = errors.clone().requires_grad_(True)
    loss, clipped, weights = group_preference_loss(
        live,
        errors,
        advantages,
        torch.tensor([0, 0, 0, 1, 1, 1]),
        2,
        beta=10.0,
        group_size=3,
        old_errors=errors + shifts,
        clip_range=0.01,
    )
    assert clipped.tolist() == [True, False, True, False, False, False]
    loss.backward()
    assert live.grad[clipped].abs().max() == 0
    torch.testing.assert_close(live.grad[~clipped], (weights * advantages / 6)[~clipped])
    unclipped, _, _ = group_preference_loss(
        errors, errors, advantages, torch.tensor([0, 0, 0, 1, 1, 1]), 2, beta=10.0, group_size=3
    )
    torch.testing.assert_close(loss.detach(), unclipped)  # the clip changes the gradient, not the value


def test_old_decay_ramps_to_its_cap():
    assert [old_decay(k, ramp=1e-3, max_decay=0.3) for k in (0, 1, 100, 300, 5000)] == pytest.approx(
        [0, 0.001, 0.1, 0.3, 0.3]
    )


def test_trained_sigmas_are_strata_of_the_high_noise_sampling_sigmas():
    sigmas = torch.linspace(1, 0, 11)  # 1.0, 0.9, ..., 0.0
    assert trained_step_span(sigmas, 0.6) == (0, 6)  # 1.0 .. 0.4
    assert trained_step_span(sigmas, 1.0) == (0, 9)  # the final 0 is never trained
    uniforms = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.999, 0.999, 0.999, 0.999]])
    assert stratified_indices(uniforms, 0, 6).tolist() == [[0, 1, 3, 4], [0, 2, 3, 5]]


def test_a_group_shares_its_noise_and_sigmas_and_groups_differ(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=DGPOTrainer, **SMALL)
    rollout = trainer.sample()
    sigmas, noise = trainer.training_points(rollout)
    assert sigmas.shape == (8, 2) and noise.shape == rollout.final.shape
    for rows in (slice(0, 4), slice(4, 8)):
        assert (sigmas[rows] == sigmas[rows][0]).all() and (noise[rows] == noise[rows][0]).all()
    assert not torch.equal(noise[0], noise[4])
    assert set(sigmas.flatten().tolist()) <= set(trainer.sigma_table[:4].tolist())  # sigma >= 0.4 of 5 steps
    torch.testing.assert_close(trainer.training_points(rollout.select([6, 1]))[1], noise[[6, 1]], rtol=0, atol=0)
    trainer._passes.update([0])  # a second pass over group 0 draws anew
    assert not torch.equal(trainer.training_points(rollout.select([0]))[1], noise[[0]])


def test_micro_batches_hold_whole_groups(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=DGPOTrainer, **{**SMALL, "prompts_per_iteration": 4, "rollout_batch_size": 16})
    batches = trainer.rollouts.micro_batches(16, 0, 0, block=4)
    assert sorted(sorted(b.rows) for b in batches) == [list(range(g, g + 4)) for g in (0, 4, 8, 12)]
    orders = {tuple(b.rows[0] for b in trainer.rollouts.micro_batches(16, i, 0, block=4)) for i in range(6)}
    assert len(orders) > 1  # the groups are shuffled


def test_a_micro_batch_that_splits_a_group_is_refused(make_trainer, tmp_path):
    with pytest.raises(ValueError, match="train_batch_size \\(6\\) must be a multiple of group_size \\(4\\)"):
        make_trainer(tmp_path, cls=DGPOTrainer, **{**SMALL, "train_batch_size": 6})


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"train_timesteps": 4}, "train.train_timesteps"),  # 5 steps: sigmas 1, 0.8, 0.6, 0.4 span 3 strata
        ({"sampling": {"dynamics": "flow-sde", "steps": 5}}, "sampling.dynamics"),
    ],
)
def test_a_stage_that_cannot_work_is_refused_naming_its_path(make_trainer, tmp_path, change, where):
    with pytest.raises(FlowpostError) as error:
        make_trainer(tmp_path, cls=DGPOTrainer, **{**SMALL, **change})
    assert error.value.where == f"stages.sft.{where}"


def test_a_split_group_and_sde_rollouts_are_refused_at_validate_time():
    stage = {
        "trainer": "dgpo",
        "model": {"family": "tiny-sd3", "init": "scratch"},
        "data": {"dataset": "digits", "conditions": "c"},
        "sampling": {"dynamics": "ode"},
        "rewards": [{"name": "jpeg_incompressibility"}],
        "train": {"group_size": 8, "train_batch_size": 12},
    }
    pipeline = {
        "name": "p",
        "datasets": {"digits": {"source": "builtin-digits"}},
        "conditions": {"c": {"encoder": "minilm", "datasets": ["digits"]}},
        "stages": {"dgpo": stage},
    }
    with pytest.raises(FlowpostError, match=r"stages\.dgpo\.train\.train_batch_size.*multiple of group_size"):
        validate_pipeline(pipeline)
    stage["train"]["train_batch_size"] = 8
    stage["sampling"] = {"dynamics": "flow-sde"}
    with pytest.raises(
        FlowpostError, match=r"stages\.dgpo\.sampling\.dynamics: trainer 'dgpo' trains on clean ODE samples"
    ):
        validate_pipeline(pipeline)
    del stage["sampling"]  # the default flow-sde too
    with pytest.raises(FlowpostError, match=r"stages\.dgpo\.sampling\.dynamics"):
        validate_pipeline(pipeline)
    stage["sampling"] = {"dynamics": "ode"}
    validate_pipeline(pipeline)


def test_training_points_take_the_device_and_dtype_of_the_latents(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=DGPOTrainer, **SMALL)
    batch = trainer.sample().select([0, 1, 2, 3])
    batch.final = batch.final.double()
    sigmas, noise = trainer.training_points(batch)
    assert {sigmas.dtype, noise.dtype} == {torch.float64}
    assert sigmas.device == noise.device == trainer.accelerator.device


def test_a_stage_trains_moves_the_old_copy_and_keeps_the_reference(make_trainer, tmp_path):
    from flowpost.core.events import read_events

    trainer = make_trainer(tmp_path, cls=DGPOTrainer, iterations=1, log_every=1, kl_beta=0.1, **SMALL)
    module = trainer.adapter.module()
    initial = {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}
    assert set(trainer.adapter.snapshots.names()) == {"ref", "old"}
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    live = {k: p.detach() for k, p in module.named_parameters() if p.requires_grad}
    assert any(not torch.equal(initial[k], live[k]) for k in live)
    ref = trainer.adapter.snapshots.state_dict("ref")
    assert all(torch.equal(ref[k], initial[k]) for k in ref)
    metrics = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "progress"][-1]["metrics"]
    assert {"loss", "policy_loss", "kl", "clip_fraction", "group_weight", "old_decay"} <= set(metrics)
    assert metrics["old_decay"] == pytest.approx(0.001) and metrics["kl"] > 0


def test_the_old_copy_follows_the_live_weights_by_its_ramped_decay(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=DGPOTrainer, iterations=1, old_decay_ramp=0.25, **SMALL)
    module, snapshots = trainer.adapter.module(), trainer.adapter.snapshots
    trainer.start()  # two steps: d = 0 (old <- live), then d = 0.25
    first = {k: v.clone() for k, v in snapshots.state_dict("old").items()}
    live = {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1)
    trainer.step_optimizer({})  # no gradients: the weights stay; step index 2 gives d = 0.3 (the cap)
    for key, value in snapshots.state_dict("old").items():
        torch.testing.assert_close(value, 0.3 * first[key] + 0.7 * (live[key] + 0.1))


def test_a_dgpo_stage_resumes_to_identical_weights_and_old_copy(make_trainer, tmp_path):
    settings = {**SMALL, "iterations": 2, "inner_epochs": 2, "kl_beta": 0.01}
    straight = make_trainer(tmp_path / "straight", cls=DGPOTrainer, resume=False, **settings)
    straight.start()
    make_trainer(tmp_path / "resumed", cls=DGPOTrainer, checkpoint_every=1, **{**settings, "iterations": 1}).start()
    resumed = make_trainer(tmp_path / "resumed", cls=DGPOTrainer, checkpoint_every=1, **settings)
    resumed.start()
    assert resumed.progress == straight.progress
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    old_a, old_b = straight.adapter.snapshots.state_dict("old"), resumed.adapter.snapshots.state_dict("old")
    assert all(torch.equal(old_a[k], old_b[k]) for k in old_a)


def test_rollouts_sample_with_the_old_copy_after_the_switch(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=DGPOTrainer, iterations=1, sample_with_old_after=1, **SMALL)
    assert torch.equal(trainer.sample().final, trainer.generate().final)  # step 0: the live weights
    trainer.start()  # 2 optimizer steps: old trails the live weights
    with trainer.adapter.use_snapshot("old"):
        by_old = trainer.generate().final
    assert torch.equal(trainer.sample().final, by_old)
    assert not torch.equal(by_old, trainer.generate().final)
