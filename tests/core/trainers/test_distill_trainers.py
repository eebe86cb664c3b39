"""Distillation stages on the tiny model: consistency, diffusion-opd and kd train, resume exactly,
keep the teacher frozen, and reject configurations they cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowpost.core.events import read_events
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.distill.consistency import ConsistencyTrainer
from flowpost.core.trainers.distill.opd import OPDTrainer, trained_states
from flowpost.errors import FlowpostError

INIT = "teacher-weights"  # the spec's init_from: distillation needs one (its weights are the adapter's)
EMA = {"ema": {"decay": 0.9, "schedule": "constant"}}
ROLLOUTS = {"prompts_per_iteration": 4, "group_size": 1, "rollout_batch_size": 4, "train_batch_size": 2}


def _trainable(trainer) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in trainer.adapter.module().named_parameters() if p.requires_grad}


def _step_metrics(out: Path) -> list[dict]:
    return [e["metrics"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]


def test_a_consistency_stage_trains_the_student_and_keeps_the_teacher(make_trainer, tmp_path):
    trainer = make_trainer(
        tmp_path, cls=ConsistencyTrainer, init_from=INIT, callbacks=EMA, max_steps=3, teacher_steps=4, log_every=1
    )
    before = _trainable(trainer)
    trainer.start()
    teacher = trainer.adapter.snapshots.state_dict(Snapshot.TEACHER)
    assert all(torch.equal(teacher[k], before[k]) for k in before)
    after = _trainable(trainer)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    metrics = _step_metrics(tmp_path)
    assert len(metrics) == 3 and all(m["loss"] > 0 and torch.isfinite(torch.tensor(m["loss"])) for m in metrics)


def test_consistency_resumes_to_identical_weights_target_and_teacher(make_trainer, tmp_path):
    settings = {"cls": ConsistencyTrainer, "init_from": INIT, "callbacks": EMA, "teacher_steps": 4}
    straight = make_trainer(tmp_path / "straight", resume=False, max_steps=4, **settings)
    straight.start()
    make_trainer(tmp_path / "resumed", max_steps=2, checkpoint_every=1, **settings).start()
    resumed = make_trainer(tmp_path / "resumed", max_steps=4, checkpoint_every=1, **settings)
    resumed.start()
    assert resumed.progress == straight.progress
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for name in (Snapshot.EMA, Snapshot.TEACHER):
        x, y = straight.adapter.snapshots.state_dict(name), resumed.adapter.snapshots.state_dict(name)
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_consistency_without_an_ema_target_names_the_callback(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match=r"stages\.sft\.callbacks\.ema.*target_weights: live"):
        make_trainer(tmp_path, cls=ConsistencyTrainer, init_from=INIT, max_steps=1)
    trainer = make_trainer(tmp_path, cls=ConsistencyTrainer, init_from=INIT, max_steps=1, target_weights="live")
    assert trainer.start().optimizer_step == 1


@pytest.mark.parametrize("cls, settings", [(ConsistencyTrainer, {"callbacks": EMA}), (OPDTrainer, ROLLOUTS)])
def test_distillation_from_scratch_has_no_teacher(make_trainer, tmp_path, cls, settings):
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.init: distillation needs a teacher"):
        make_trainer(tmp_path, cls=cls, **settings)


def test_opd_takes_no_reward(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match=r"stages\.sft\.rewards: trainer OPDTrainer uses no reward"):
        make_trainer(tmp_path, cls=OPDTrainer, init_from=INIT, rewards=[{"name": "jpeg_incompressibility"}])


def test_opd_trains_on_every_state_the_student_visits(make_trainer, tmp_path):
    sampling = {"dynamics": "ode", "steps": 3}
    trainer = make_trainer(tmp_path, cls=OPDTrainer, init_from=INIT, sampling=sampling, **ROLLOUTS)
    rollout = trainer.sample()
    assert rollout.rewards is None and rollout.latents is not None
    assert rollout.steps.tolist() == [0, 1]  # the window; the last step's state is its final next state
    states, sigma, sigma_next = trained_states(rollout, trainer.grid)
    assert states.shape[0] == 3 * len(rollout)
    torch.testing.assert_close(states[-len(rollout) :], rollout.next_latents[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(sigma_next[-len(rollout) :], torch.zeros(len(rollout)), rtol=0, atol=0)
    torch.testing.assert_close(sigma, trainer.grid[:3].repeat_interleave(len(rollout)), rtol=0, atol=0)


@pytest.mark.parametrize("target", ["xt", "v", "x0"])
def test_opd_starts_at_zero_loss_against_its_own_weights_but_not_a_finer_teacher(make_trainer, tmp_path, target):
    settings = {"cls": OPDTrainer, "init_from": INIT, "sampling": {"dynamics": "ode", "steps": 3}, "target": target}
    same = make_trainer(tmp_path / "same", **settings, **ROLLOUTS)
    rollout = same.sample()
    assert float(same.backpropagate(same.loss(rollout, scale=1.0))["loss"]) == 0.0
    finer = make_trainer(tmp_path / "finer", teacher_substeps=3, **settings, **ROLLOUTS)
    assert float(finer.backpropagate(finer.loss(rollout, scale=1.0))["loss"]) > 0


def test_an_opd_stage_moves_the_student_toward_a_finer_teacher_and_resumes_exactly(make_trainer, tmp_path):
    settings = {
        "cls": OPDTrainer,
        "init_from": INIT,
        "sampling": {"dynamics": "flow-sde", "steps": 3, "noise_level": 0.5},
        "teacher_substeps": 3,
        "target": "xt",
        "lr": 3e-4,
        **ROLLOUTS,
    }
    straight = make_trainer(tmp_path / "straight", resume=False, iterations=4, log_every=1, **settings)
    before = _trainable(straight)
    straight.start()
    after = _trainable(straight)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    teacher = straight.adapter.snapshots.state_dict(Snapshot.TEACHER)
    assert all(torch.equal(teacher[k], before[k]) for k in before)
    metrics = _step_metrics(tmp_path / "straight")
    assert not any(key.startswith("reward") for m in metrics for key in m)
    make_trainer(tmp_path / "resumed", iterations=2, checkpoint_every=1, **settings).start()
    resumed = make_trainer(tmp_path / "resumed", iterations=4, checkpoint_every=1, **settings)
    resumed.start()
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_distillation_trainers_run_unchanged_on_the_sd3_family(
    make_trainer, tmp_path, sd3_pipeline_dir, sd3_data_dirs
):
    from tiny_sd3_pipeline import load_sd3_adapter

    consistency = make_trainer(
        tmp_path / "consistency",
        cls=ConsistencyTrainer,
        adapter=load_sd3_adapter(sd3_pipeline_dir),
        dirs=sd3_data_dirs,
        init_from=INIT,
        callbacks=EMA,
        teacher_steps=4,
        teacher_guidance=2.0,
        max_steps=1,
    )
    before = _trainable(consistency)
    consistency.start()
    assert any(not torch.equal(p, before[k]) for k, p in _trainable(consistency).items())
    opd = make_trainer(
        tmp_path / "opd",
        cls=OPDTrainer,
        adapter=load_sd3_adapter(sd3_pipeline_dir),
        dirs=sd3_data_dirs,
        init_from=INIT,
        lora_rank=4,
        sampling={"dynamics": "ode", "steps": 2},
        teacher_substeps=2,
        iterations=1,
        **ROLLOUTS,
    )
    lora = {k: v for k, v in _trainable(opd).items() if "lora_B" in k}
    opd.start()
    after = _trainable(opd)
    assert lora and any(not torch.equal(after[k], v) for k, v in lora.items())
