"""DMD2: the distribution-matching gradient, fake/generator alternation, role ownership, resume."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.distill.distribution_matching import dmd_generator_loss, dmd_gradient
from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.errors import FlowpostError

SMALL = {"prompts_per_iteration": 4, "group_size": 1, "rollout_batch_size": 4, "train_batch_size": 4}
SAMPLING = {"dynamics": "ode", "steps": 2, "guidance": 1.0}
OPTIMIZERS = {GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 2e-3}}


def _dmd2(make_trainer, out, sampling=SAMPLING, **args):
    options = {**SMALL, "iterations": 2, "ttur": 2, **args}
    return make_trainer(out, cls=DMD2Trainer, sampling=sampling, optimizers=OPTIMIZERS, **options)


def test_the_generator_loss_gradient_is_the_normalised_score_difference():
    generator = torch.Generator().manual_seed(0)
    x0, real, fake = (torch.randn(3, 1, 4, 4, generator=generator) for _ in range(3))
    gradient = dmd_gradient(x0, real, fake)
    scale = (x0 - real).abs().flatten(1).mean(1).view(-1, 1, 1, 1)
    torch.testing.assert_close(gradient, (fake - real) / scale)
    live = x0.clone().requires_grad_(True)
    dmd_generator_loss(live, x0 - gradient).sum().backward()
    torch.testing.assert_close(live.grad, gradient / 16)


def test_a_real_sample_where_both_scores_agree_gets_no_gradient_and_nan_is_zeroed():
    x0 = torch.randn(2, 1, 4, 4)
    assert dmd_gradient(x0, x0 + 1, x0 + 1).abs().max() == 0
    assert torch.isfinite(dmd_gradient(x0, x0, x0 + 1)).all()  # zero normaliser: inf entries zeroed


def test_fake_score_updates_ttur_times_then_the_generator_once_each_touching_only_its_role(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path, iterations=1)
    generator = trainer.adapter.variants.module(GENERATOR)
    fake = trainer.adapter.variants.module(FAKE_SCORE)
    order: list[tuple[str, bool, bool]] = []
    step_role = trainer.step_role

    def recording(role, metrics):
        before = [p.detach().clone() for p in (*generator.parameters(), *fake.parameters())]
        result = step_role(role, metrics)
        after = [p.detach() for p in (*generator.parameters(), *fake.parameters())]
        count = len(list(generator.parameters()))
        changed = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
        order.append((role, any(changed[:count]), any(changed[count:])))
        return result

    trainer.step_role = recording
    trainer.start()
    assert order == [(FAKE_SCORE, False, True)] * 2 + [(GENERATOR, True, False)]
    assert trainer.roles[FAKE_SCORE].updates == 2 and trainer.progress.optimizer_step == 1
    assert Snapshot.TEACHER in trainer.adapter.snapshots


def test_each_role_has_its_own_optimizer_over_its_own_parameters(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path)
    owned = {
        role: {id(p) for o in opt.optimizer for g in o.param_groups for p in g["params"]}
        for role, opt in trainer.roles.items()
    }
    networks = {role: {id(p) for p in trainer.adapter.variants.module(role).parameters()} for role in owned}
    assert owned == networks and not owned[GENERATOR] & owned[FAKE_SCORE]
    assert [o.param_groups[0]["lr"] for o in trainer.roles[FAKE_SCORE].optimizer] == [2e-3]


def _role_state(trainer):
    weights = {role: trainer.adapter.variants.module(role).state_dict() for role in (GENERATOR, FAKE_SCORE)}
    moments = {
        role: [state["exp_avg"] for o in opt.optimizer for state in o.state.values()]
        for role, opt in trainer.roles.items()
    }
    return weights, moments


def test_a_resumed_dmd2_stage_matches_an_uninterrupted_one_in_every_role(make_trainer, tmp_path):
    settings = {"iterations": 2, "callbacks": {"ema": {"decay": 0.9}}}
    straight = _dmd2(make_trainer, tmp_path / "straight", resume=False, **settings)
    straight.start()
    _dmd2(make_trainer, tmp_path / "resumed", checkpoint_every=1, **{**settings, "iterations": 1}).start()
    resumed = _dmd2(make_trainer, tmp_path / "resumed", checkpoint_every=1, **settings)
    resumed.start()
    assert resumed.progress == straight.progress and resumed.progress.optimizer_step == 2
    assert resumed.roles[FAKE_SCORE].updates == straight.roles[FAKE_SCORE].updates == 4
    (weights_a, moments_a), (weights_b, moments_b) = _role_state(straight), _role_state(resumed)
    for role in weights_a:
        assert all(torch.equal(weights_a[role][k], weights_b[role][k]) for k in weights_a[role])
        assert len(moments_a[role]) == len(moments_b[role]) > 0
        assert all(torch.equal(a, b) for a, b in zip(moments_a[role], moments_b[role], strict=True))
    for name in (Snapshot.TEACHER, Snapshot.EMA):
        a, b = straight.adapter.snapshots.state_dict(name), resumed.adapter.snapshots.state_dict(name)
        assert all(torch.equal(a[k], b[k]) for k in a)
    teacher = straight.adapter.snapshots.state_dict(Snapshot.TEACHER)
    live = dict(straight.adapter.variants.module(GENERATOR).named_parameters())
    assert any(not torch.equal(teacher[k], live[k].detach()) for k in teacher)  # the teacher stayed frozen


def test_snapshots_are_keyed_by_the_first_roles_network_and_a_checkpoint_naming_others_is_refused(
    make_trainer, tmp_path
):
    import dataclasses

    from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    trainer = _dmd2(make_trainer, tmp_path, iterations=1, checkpoint_every=1)
    trainer.start()
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"), verified=True)
    network = {name for name, _ in trainer.adapter.variants.module(GENERATOR).named_parameters()}
    assert set(state.snapshots[Snapshot.TEACHER]) == network  # not the bundle's role-prefixed names
    assert {key.split(".")[0] for key in state.model} == {GENERATOR, FAKE_SCORE}
    prefixed = {f"{GENERATOR}.{key}": value for key, value in state.snapshots[Snapshot.TEACHER].items()}
    save_checkpoint(
        tmp_path / "checkpoints", dataclasses.replace(state, step=2, snapshots={Snapshot.TEACHER: prefixed})
    )
    with pytest.raises(FlowpostError, match=r"step-2 holds snapshot 'teacher' with .* the network lacks.*--no-resume"):
        _dmd2(make_trainer, tmp_path, iterations=2, checkpoint_every=1).start()


def test_guided_real_scores_need_and_use_the_null_prompt(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path, iterations=1, real_guidance=3.0)
    assert trainer.null is not None and len(trainer.null) == 1
    trainer.start()
    assert trainer.progress.optimizer_step == 1


def test_the_student_must_sample_with_the_ode_over_all_its_steps(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match="dynamics: ode"):
        make_trainer(
            tmp_path, cls=DMD2Trainer, sampling={"dynamics": "flow-sde", "steps": 2}, optimizers=OPTIMIZERS, **SMALL
        )


def test_lora_roles_are_one_adapter_each_on_a_frozen_shared_base(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path, iterations=1, lora_rank=4)
    network = trainer.adapter.module()
    assert trainer.adapter.trainable_network() is network and trainer.adapter.role_networks() == [network]
    owned = {role: dict(trainer.adapter.variants.named_parameters(role)) for role in (GENERATOR, FAKE_SCORE)}
    assert all(".default." in name for name in owned[GENERATOR]) and all(".fake_score." in n for n in owned[FAKE_SCORE])
    before = {name: param.detach().clone() for name, param in network.named_parameters()}
    trainer.start()
    after = dict(network.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name].detach())}
    assert changed and changed <= set(owned[GENERATOR]) | set(owned[FAKE_SCORE])
    assert changed & set(owned[GENERATOR]) and changed & set(owned[FAKE_SCORE])
    assert (tmp_path / "final" / "live" / "lora").is_dir()
    with trainer.adapter.use_component_variant(FAKE_SCORE):
        assert network.active_adapters() == [FAKE_SCORE]
    assert network.active_adapters() == ["default"]


def _recorded_rounds(trainer, monkeypatch) -> list[dict[str, list]]:
    """Per micro-batch round: the x0 each fake-score update fits, the x0 the generator's distribution-matching
    gradient is applied to (live and its detached anchor), and the micro-batch's stored final samples."""
    from flowpost.core.trainers.distill import dmd2

    rounds: list[dict[str, list]] = []
    fit, push = dmd2.flow_matching_loss, dmd2.dmd_generator_loss
    gradient = dmd2.dmd_gradient

    def current() -> dict[str, list]:
        if not rounds or rounds[-1]["live"]:
            rounds.append({"fitted": [], "live": [], "anchor": [], "final": []})
        return rounds[-1]

    def fitted(prediction, noise, x0):
        current()["fitted"].append(x0.detach().clone())
        return fit(prediction, noise, x0)

    def anchored(x0, real, fake):
        current()["anchor"].append(x0.detach().clone())
        return gradient(x0, real, fake)

    def pushed(x0, target):
        rounds[-1]["live"].append(x0.detach().clone())
        return push(x0, target)

    objective = trainer.fake_score_objective

    def fake_score_objective(batch, tag):
        current()["final"].append(batch.final.clone())
        return objective(batch, tag)

    monkeypatch.setattr(dmd2, "flow_matching_loss", fitted)
    monkeypatch.setattr(dmd2, "dmd_gradient", anchored)
    monkeypatch.setattr(dmd2, "dmd_generator_loss", pushed)
    monkeypatch.setattr(trainer, "fake_score_objective", fake_score_objective)
    return rounds


def test_with_several_steps_the_fake_score_fits_the_x0_the_generator_is_pushed_on(make_trainer, tmp_path, monkeypatch):
    trainer = _dmd2(make_trainer, tmp_path, sampling={**SAMPLING, "steps": 3}, train_batch_size=2)
    rounds = _recorded_rounds(trainer, monkeypatch)
    trainer.start()
    assert len(rounds) == 4  # 2 iterations x 2 micro-batches
    intermediate = 0
    for record in rounds:
        assert len(record["fitted"]) == 2 and len(record["live"]) == len(record["anchor"]) == 1  # ttur 2
        (live,), (anchor,) = record["live"], record["anchor"]
        assert torch.equal(live, anchor)
        assert all(torch.equal(fitted, live) for fitted in record["fitted"])
        final = record["final"][0]
        intermediate += sum(not torch.equal(live[row], final[row]) for row in range(len(final)))
    assert intermediate > 0  # some rows were pushed at an intermediate step, whose x0 is not the final sample


def test_the_last_steps_x0_is_the_rollouts_final_sample_and_each_samples_step_is_its_own_draw(
    make_trainer, tmp_path, monkeypatch
):
    steps: dict[int, dict[int, int]] = {}
    for size in (4, 2):
        sampling = {**SAMPLING, "steps": 3}
        trainer = _dmd2(make_trainer, tmp_path / str(size), sampling=sampling, iterations=1, train_batch_size=size)
        seen = []
        prediction = trainer.prediction

        def recording(batch, prediction=prediction, seen=seen):
            predicted = prediction(batch)
            seen.append((batch, predicted))
            return predicted

        monkeypatch.setattr(trainer, "prediction", recording)
        trainer.start()
        steps[size] = {int(i): int(k) for batch, p in seen for i, k in zip(batch.indices, p.step, strict=True)}
        if size == 4:  # one round per rollout: the generator has not moved since it sampled
            batch, predicted = seen[0]
            last = predicted.step == 2
            assert 0 < int(last.sum()) < len(batch)
            assert torch.equal(predicted.x0[last], batch.final[last])
            assert all(not torch.equal(predicted.x0[row], batch.final[row]) for row in torch.nonzero(~last).flatten())
    assert steps[4] == steps[2] and len(steps[4]) == 4  # keyed by sample index, not by micro-batch
