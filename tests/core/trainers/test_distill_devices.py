"""The distillers' updates create every tensor on the latents' device, checked on ``meta`` without a GPU:
the rollout, both roles and the teacher snapshot live there; the sigma tables stay on the CPU."""

from __future__ import annotations

import pytest
import torch
from one_device import OneDevice, rollout_on

from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.core.trainers.distill.tdm import TDMTrainer

META = torch.device("meta")


@pytest.mark.parametrize("cls", [DMD2Trainer, TDMTrainer])
def test_each_update_runs_on_the_latents_device(make_trainer, tmp_path, cls):
    trainer = make_trainer(
        tmp_path,
        cls=cls,
        sampling={"dynamics": "ode", "steps": 3},
        optimizers={GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 1e-3}},
        prompts_per_iteration=2,
        group_size=1,
        rollout_batch_size=2,
        train_batch_size=2,
        real_guidance=2.0,
    )
    rollout = trainer.generate()
    on_meta = rollout_on(trainer, rollout, META)
    with OneDevice():
        losses = [trainer.fake_score_objective(on_meta, "0-0")]
        losses[0].backward()
        for loss in trainer.generator_objectives(on_meta, "0-1"):  # each backward before the next teacher swap
            loss.backward()
            losses.append(loss)
    assert all(loss.device == META and loss.dtype == torch.float32 and loss.dim() == 0 for loss in losses)
    for role in (GENERATOR, FAKE_SCORE):
        grads = [p.grad for p in trainer.adapter.variants.module(role).parameters() if p.grad is not None]
        assert grads and all(g.device == META for g in grads)
