"""DMD2: the distribution-matching gradient, fake/generator alternation, role ownership, resume."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.trainers.distill.distribution_matching import dmd_generator_loss, dmd_gradient
from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR, TEACHER

SMALL = {"prompts_per_iteration": 4, "group_size": 1, "rollout_batch_size": 4, "train_batch_size": 4}
SAMPLING = {"dynamics": "ode", "steps": 2, "guidance": 1.0}
OPTIMIZERS = {GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 2e-3}}


def _dmd2(make_trainer, out, **args):
    options = {**SMALL, "iterations": 2, "ttur": 3, **args}
    return make_trainer(out, cls=DMD2Trainer, sampling=SAMPLING, optimizers=OPTIMIZERS, **options)


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
    assert order == [(FAKE_SCORE, False, True)] * 3 + [(GENERATOR, True, False)]
    assert trainer.roles[FAKE_SCORE].updates == 3 and trainer.progress.optimizer_step == 1
    assert TEACHER in trainer.adapter.snapshots


def test_each_role_has_its_own_optimizer_over_its_own_parameters(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path)
    owned = {role: {id(p) for o in opt.optimizer for g in o.param_groups for p in g["params"]}
             for role, opt in trainer.roles.items()}
    networks = {role: {id(p) for p in trainer.adapter.variants.module(role).parameters()} for role in owned}
    assert owned == networks and not owned[GENERATOR] & owned[FAKE_SCORE]
    assert [o.param_groups[0]["lr"] for o in trainer.roles[FAKE_SCORE].optimizer] == [2e-3]
