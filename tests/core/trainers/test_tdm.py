"""TDM: the linear-flow re-noising, its losses and weights against closed forms; a tiny stage."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.trainers.distill.distribution_matching import (
    mixed_noise,
    pseudo_huber,
    renoise_between,
    tdm_fake_weights,
    tdm_generator_loss,
)
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.core.trainers.distill.tdm import TDMTrainer


def test_renoising_from_a_clean_state_is_the_forward_process():
    x0, zeta = torch.randn(3, 1, 4, 4), torch.randn(3, 1, 4, 4)
    sigma_t = torch.tensor([0.2, 0.5, 0.9])
    expected = (1 - sigma_t).view(-1, 1, 1, 1) * x0 + sigma_t.view(-1, 1, 1, 1) * zeta
    torch.testing.assert_close(renoise_between(x0, torch.zeros(3), sigma_t, zeta), expected)


def test_renoising_keeps_the_marginal_of_the_linear_flow():
    """``x_next = (1 - s) x0 + s eps``: the re-noised state has mean ``(1 - t) x0`` and std ``t``."""
    torch.manual_seed(0)
    x0 = torch.randn(1, 64).expand(20_000, 64)
    s, t = torch.full((20_000,), 0.3), torch.full((20_000,), 0.7)
    x_next = (1 - 0.3) * x0 + 0.3 * torch.randn(20_000, 64)
    x_t = renoise_between(x_next, s, t, torch.randn(20_000, 64))
    torch.testing.assert_close(x_t.mean(0), (1 - 0.7) * x0[0], atol=0.02, rtol=0)
    torch.testing.assert_close(x_t.std(0), torch.full((64,), 0.7), atol=0.02, rtol=0)
    eps_mix = mixed_noise(x_t, x0, t)
    torch.testing.assert_close((1 - t).view(-1, 1) * x0 + t.view(-1, 1) * eps_mix, x_t)


def test_the_generator_loss_moves_x0_toward_the_real_prediction():
    generator = torch.Generator().manual_seed(1)
    x0, real, fake = (torch.randn(2, 1, 4, 4, generator=generator) for _ in range(3))
    for huber_c in (None, 1e-3):
        live = x0.clone().requires_grad_(True)
        tdm_generator_loss(live, real, fake, huber_c=huber_c).sum().backward()
        delta = fake - real
        scale = (x0 - real).abs().flatten(1).mean(1).view(-1, 1, 1, 1)
        slope = delta if huber_c is None else delta / (delta.pow(2) + huber_c**2).sqrt()
        torch.testing.assert_close(live.grad, slope / (16 * scale))
    assert pseudo_huber(torch.tensor([0.0, 3.0]), 1e-3).tolist() == pytest.approx(
        [0.0, 3.0 - 1e-3 + 1e-3**2 / 6], abs=1e-6
    )


def test_fake_weights_cap_the_snr_and_clip_the_importance_weight():
    sigma = torch.tensor([0.1, 0.5, 0.9])
    same = torch.randn(3, 1, 4, 4)
    weights = tdm_fake_weights(sigma, same, same, snr_cap=5.0, clip=20.0)
    torch.testing.assert_close(weights, torch.tensor([5.0, 1.0, (0.1 / 0.9) ** 2]))
    far = tdm_fake_weights(sigma, same * 0 + 100.0, same * 0, snr_cap=5.0, clip=20.0)
    torch.testing.assert_close(far, weights / 20.0)


def test_a_tdm_stage_alternates_its_roles_and_trains_the_generator(make_trainer, tmp_path):
    trainer = make_trainer(
        tmp_path,
        cls=TDMTrainer,
        sampling={"dynamics": "ode", "steps": 2},
        optimizers={GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 1e-3}},
        prompts_per_iteration=4,
        group_size=1,
        rollout_batch_size=4,
        train_batch_size=4,
        iterations=1,
        ttur=2,
    )
    before = {k: v.clone() for k, v in trainer.adapter.module().state_dict().items()}
    roles: list[str] = []
    step_role = trainer.step_role
    trainer.step_role = lambda role, metrics: roles.append(role) or step_role(role, metrics)
    trainer.start()
    assert roles == [FAKE_SCORE, FAKE_SCORE, GENERATOR]
    after = trainer.adapter.module().state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
