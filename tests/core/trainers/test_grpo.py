"""GRPO: rollout replay consistency, the PPO-clip objective, group layout, a full tiny stage."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.advantages import zero_advantage_fraction
from flowpost.core.memory import GIB, activation_bytes
from flowpost.core.models.footprint import model_footprint
from flowpost.core.trainers.objective import to_host
from flowpost.core.trainers.rl.groups import plan_groups
from flowpost.core.trainers.rl.grpo import GRPOTrainer, ppo_clip_loss
from flowpost.core.trainers.rl.replay_width import auto_replay_width, replay_budget

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


def _replay(trainer, batch, **kwargs) -> dict[str, float]:
    """Backpropagate the replay loss of ``batch`` (the loop's part); its metrics on the host."""
    return to_host(trainer.backpropagate(trainer.replay_loss(batch, scale=1.0, **kwargs)))[0]


@pytest.mark.parametrize("dynamics", ["flow-sde", "dance-sde", "cps"])
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_replay_reproduces_rollout_log_probs_at_the_training_micro_batch(make_trainer, tmp_path, dynamics, guidance):
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        rewards=JPEG,
        sampling={"dynamics": dynamics, "steps": 6, "guidance": guidance},
        **SMALL,
    )
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    assert rollout.log_probs.shape == (8, 5) and torch.isfinite(rollout.log_probs).all()
    for rows in ([0, 3, 5, 6], [1, 2, 4, 7]):  # the shuffled micro-batches training uses
        replayed = trainer.replay_log_probs(rollout.select(rows))
        ratio = torch.exp(replayed - rollout.log_probs[rows])
        assert float((ratio - 1).abs().max()) < 1e-5


def _activation_gib(trainer, rows: int) -> float:
    """GiB of ``rows`` samples' replay activations, as ``replay_steps_per_pass: auto`` estimates them."""
    footprint = model_footprint(trainer.adapter)
    return rows * activation_bytes(footprint, text_tokens=16, activation_itemsize=4, lora=False) / GIB


@pytest.mark.parametrize("kl_space", ["x", "v"])
def test_replaying_all_steps_in_one_pass_matches_one_pass_per_step(make_trainer, tmp_path, kl_space):
    grads = []
    for per_pass in (1, 0, 2, "auto"):
        trainer = make_trainer(
            tmp_path / str(per_pass),
            cls=GRPOTrainer,
            rewards=JPEG,
            sampling={"steps": 6, "guidance": 3.0},
            kl_beta=0.5,
            kl_space=kl_space,
            replay_steps_per_pass=per_pass,
            **SMALL,
        )
        if per_pass == "auto":  # a budget of 3.5 steps of 4 rows with their CFG copies: passes of 3 and 2 steps
            budget = 3.5 * _activation_gib(trainer, rows=2 * 4)
            trainer.args = trainer.args.model_copy(update={"replay_memory_gib": budget})
        rollout = trainer.sample()
        trainer.rollouts.score(rollout)
        trainer.adapter.module().zero_grad()
        metrics = _replay(trainer, rollout.select([0, 3, 5, 6]))
        params = [p for p in trainer.adapter.module().parameters() if p.grad is not None]
        grads.append((torch.cat([p.grad.flatten() for p in params]), metrics))
        assert trainer.auto_width == (3 if per_pass == "auto" else None)
    reference, reference_metrics = grads[0]
    assert float(reference.abs().max()) > 0
    for grad, metrics in grads[1:]:
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-6)
        assert metrics["loss"] == pytest.approx(reference_metrics["loss"], rel=1e-4, abs=1e-7)


def test_auto_replay_width_is_the_most_steps_whose_activations_fit_the_budget(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, rewards=JPEG, sampling={"steps": 6}, **SMALL)
    footprint = model_footprint(trainer.adapter)
    one_step = _activation_gib(trainer, rows=4) * GIB
    widths = [
        auto_replay_width(footprint, steps=5, rows=4, text_tokens=16, dtype=torch.float32, lora=False, budget=budget)
        for budget in (0.0, one_step, 2.99 * one_step, 3 * one_step, 100 * one_step)
    ]
    assert widths == [1, 1, 2, 3, 5]
    half = auto_replay_width(
        footprint, steps=5, rows=4, text_tokens=16, dtype=torch.bfloat16, lora=False, budget=one_step
    )
    assert half == 2  # 16-bit activations take half the bytes
    cpu = torch.device("cpu")
    assert replay_budget(cpu, footprint, None) == footprint.weight_bytes
    assert replay_budget(cpu, footprint, 0.25) == 0.25 * GIB


def _scored_off_reference(make_trainer, path, **args):
    """A GRPO trainer with KL whose live weights were moved off the reference, and its scored rollout."""
    settings = {"rewards": JPEG, "sampling": {"steps": 4}, "kl_beta": 0.5, **SMALL, **args}
    trainer = make_trainer(path, cls=GRPOTrainer, **settings)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in trainer.adapter.module().parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    return trainer, rollout


def test_the_flow_grpo_kl_scale_is_the_exact_kl_times_the_step_size(make_trainer, tmp_path):
    kls = {}
    for scale in ("exact", "flow-grpo"):
        sampling = {"steps": 6, "window": 1, "window_start": (2, 2)}
        trainer, rollout = _scored_off_reference(make_trainer, tmp_path / scale, sampling=sampling, kl_scale=scale)
        kls[scale] = _replay(trainer, rollout.select([0, 3, 5, 6]))["kl"]
    delta = float(rollout.sigmas[0] - rollout.sigmas_next[0])
    assert kls["exact"] > 0 and delta == pytest.approx(1 / 6)
    assert kls["flow-grpo"] == pytest.approx(kls["exact"] * delta, rel=1e-5)


def _loss_and_grad(trainer, batch, **kwargs) -> tuple[float, torch.Tensor]:
    trainer.adapter.module().zero_grad()
    loss = _replay(trainer, batch, **kwargs)["loss"]
    return loss, torch.cat([p.grad.flatten() for p in trainer.adapter.module().parameters() if p.grad is not None])


@pytest.mark.parametrize("kl_space", ["x", "v"])
def test_dropped_zero_advantage_rows_leave_the_loss_and_the_rest_is_renormalised(make_trainer, tmp_path, kl_space):
    trainer, rollout = _scored_off_reference(make_trainer, tmp_path, kl_space=kl_space, zero_advantage="drop")
    constant = rollout.group_ids == rollout.group_ids[0]  # as a group whose rewards are all equal
    rollout.advantages[constant] = 0.0
    others = [row for row in range(len(rollout)) if not constant[row]]
    assert zero_advantage_fraction(rollout.advantages) == 0.5

    dropped, dropped_grad = _loss_and_grad(trainer, rollout, kept=0.5)
    trainer.args = trainer.args.model_copy(update={"zero_advantage": "keep"})
    alone, alone_grad = _loss_and_grad(trainer, rollout.select(others))
    kept, _ = _loss_and_grad(trainer, rollout)
    # the same terms summed in another order: fp32 rounding of a small loss, not a difference in the rows kept
    assert dropped == pytest.approx(alone, rel=1e-4) and kept != pytest.approx(alone, rel=1e-3)
    torch.testing.assert_close(dropped_grad, alone_grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("zero_advantage", ["keep", "drop"])
def test_a_rollout_of_constant_groups_trains_only_the_kl_unless_dropped(make_trainer, tmp_path, zero_advantage):
    trainer, rollout = _scored_off_reference(make_trainer, tmp_path, zero_advantage=zero_advantage)
    rollout.advantages.zero_()
    before = {k: v.clone() for k, v in trainer.adapter.module().state_dict().items()}
    trainer.optimize(rollout)
    after = trainer.adapter.module().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) == (zero_advantage == "drop")


def test_ppo_clip_loss_moves_log_probs_with_the_advantage_and_stops_outside_the_trust_region():
    old = torch.zeros(4)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    log_prob = torch.tensor([0.0, 0.0, 0.5, -0.5], requires_grad=True)
    ppo_clip_loss(log_prob, old, advantages, clip_range=0.1).backward()
    grad = log_prob.grad
    assert grad[0] < 0 and grad[1] > 0  # descent raises the good sample's log-prob, lowers the bad one's
    assert grad[2] == 0 and grad[3] == 0  # already past 1 ± eps in the advantage's direction: clipped
    value = ppo_clip_loss(torch.zeros(4), old, advantages, clip_range=0.1)
    assert float(value) == pytest.approx(0.0)


def test_groups_are_complete_across_two_ranks_and_never_keyed_by_prompt():
    plan = plan_groups(3, prompts=4, group_size=3, seed=0, stage="grpo", iteration=5)
    ranks = [plan.rank_slice(r, 2) for r in range(2)]
    assert sorted(i for r in ranks for i in r) == list(range(12))
    groups = [plan.group_ids[i] for r in ranks for i in r]
    assert all(groups.count(g) == 3 for g in set(groups)) and set(groups) == set(range(20, 24))
    prompts = [plan.prompt_rows[i] for i in range(12)]
    assert len(set(prompts)) < 4  # a pool of 3 prompts: some prompt repeats across groups
    assert plan == plan_groups(3, prompts=4, group_size=3, seed=0, stage="grpo", iteration=5)
    assert plan != plan_groups(3, prompts=4, group_size=3, seed=0, stage="grpo", iteration=6)
    with pytest.raises(ValueError):
        plan.rank_slice(0, 5)


def test_a_grpo_stage_runs_checkpoints_and_resumes_to_identical_weights(make_trainer, tmp_path):
    from flowpost.core.events import read_events

    settings = {
        "rewards": JPEG,
        "sampling": {"steps": 4},
        "iterations": 3,
        "kl_beta": 0.1,
        "lr": 1e-3,
        "log_every": 1,
        **SMALL,
    }
    straight = make_trainer(tmp_path / "straight", cls=GRPOTrainer, resume=False, **settings)
    progress = straight.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (3, 6)
    steps = [e for e in read_events(tmp_path / "straight" / "events.jsonl") if e["event"] == "progress"]
    assert [(e["iteration"], e["step"]) for e in steps] == [(1, 2), (2, 4), (3, 6)]
    assert {"reward/total_mean", "advantage/zero_fraction", "kl", "clip_fraction"} <= set(steps[-1]["metrics"])

    first = make_trainer(tmp_path / "resumed", cls=GRPOTrainer, checkpoint_every=1, **{**settings, "iterations": 2})
    first.start()
    saved = [e for e in read_events(tmp_path / "resumed" / "events.jsonl") if e["event"] == "checkpoint"]
    assert [(e["iteration"], e["step"]) for e in saved] == [(1, 2), (2, 4)]
    assert saved[-1]["path"].endswith("step-4")
    resumed = make_trainer(tmp_path / "resumed", cls=GRPOTrainer, checkpoint_every=1, **settings)
    resumed.start()
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert "ref" in resumed.adapter.snapshots.names()


def test_check_consistency_reports_a_ratio_of_one_before_any_update(make_trainer, tmp_path):
    from flowpost.core.diagnostics import check_consistency

    trainer = make_trainer(tmp_path, cls=GRPOTrainer, rewards=JPEG, sampling={"steps": 5, "window": 2}, **SMALL)
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5
    assert report["micro_batch"] == 4 and len(report["steps"]) == 2 == len(report["per_step_log_prob_mismatch"])


def test_check_consistency_refuses_a_trainer_that_does_not_replay(make_trainer, tmp_path):
    from flowpost.core.diagnostics import check_consistency
    from flowpost.errors import FlowpostError

    with pytest.raises(FlowpostError, match="not a coupled trainer"):
        check_consistency(make_trainer(tmp_path))


def test_trackers_receive_the_rewards_of_each_iteration(make_trainer, tmp_path):
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        rewards=JPEG,
        sampling={"steps": 3},
        iterations=2,
        log_every=1,
        callbacks={"trackers": ["dvclive"]},
        **SMALL,
    )
    trainer.start()
    rewards = tmp_path / "logs" / "dvclive" / "plots" / "metrics" / "reward" / "total_mean.tsv"
    assert len(rewards.read_text().splitlines()) == 1 + 4  # header + one row per optimizer step
