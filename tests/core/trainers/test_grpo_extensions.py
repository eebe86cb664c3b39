"""GRPO-Guard and DPPO: their objectives against closed forms, and both as full coupled trainers."""

from __future__ import annotations

import math

import pytest
import torch

from flowpost.core.trainers.rl.dppo import DPPOTrainer, trust_region_mask
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.grpo_guard import GRPOGuardTrainer, normalized_ratio

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


def _element_mean_log_prob(x: torch.Tensor, mean: torch.Tensor, std: float) -> torch.Tensor:
    return (-((x - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).flatten(1).mean(1)


def test_the_normalised_ratio_is_exp_of_the_noise_delta_correlation():
    generator = torch.Generator().manual_seed(0)
    old_mean = torch.randn(3, 1, 4, 4, generator=generator)
    delta = 0.01 * torch.randn(3, 1, 4, 4, generator=generator)
    xi = torch.randn(3, 1, 4, 4, generator=generator)
    std = 0.3
    x_next = old_mean + std * xi
    ratio = normalized_ratio(
        _element_mean_log_prob(x_next, old_mean + delta, std),
        _element_mean_log_prob(x_next, old_mean, std),
        old_mean + delta,
        old_mean,
        torch.tensor(std),
    )
    torch.testing.assert_close(ratio, torch.exp((xi * delta).flatten(1).mean(1)), rtol=1e-5, atol=1e-6)


def test_the_trust_region_mask_silences_only_outward_moves_outside_the_region():
    ratio = torch.tensor([1.1, 0.9, 1.1, 0.9, 1.1, 0.9])
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    kl = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    mask = trust_region_mask(ratio, advantages, kl, threshold=0.5)
    assert mask.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("cls", [GRPOTrainer, GRPOGuardTrainer, DPPOTrainer])
def test_every_coupled_trainer_replays_with_ratio_one_and_trains(make_trainer, tmp_path, cls):
    from flowpost.core.diagnostics import check_consistency

    trainer = make_trainer(tmp_path / "check", cls=cls, rewards=JPEG, sampling={"steps": 5}, **SMALL)
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5

    trainer = make_trainer(
        tmp_path / "run", cls=cls, rewards=JPEG, sampling={"steps": 4}, iterations=2, lr=1e-3, **SMALL
    )
    before = {k: v.clone() for k, v in trainer.adapter.module().state_dict().items()}
    progress = trainer.start()
    after = trainer.adapter.module().state_dict()
    assert progress.rollout_iteration == 2 and progress.optimizer_step == 4
    assert any(not torch.equal(before[k], after[k]) for k in before)
