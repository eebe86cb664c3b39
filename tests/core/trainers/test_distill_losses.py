"""The distillation objectives and the teacher's sub-stepped ODE against independent computations."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.models.tiny_sd3 import TinySD3Adapter, TinySD3State
from flowpost.core.sampling.substeps import ode_states, solve_ode
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.distill.consistency import clean_prediction, consistency_loss
from flowpost.core.trainers.distill.kd import kd_loss
from flowpost.core.trainers.distill.opd import opd_loss
from flowpost.core.trainers.distill.teacher import teacher_velocity

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}


def _toy(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x, v_s, v_t = (torch.randn(3, 1, 2, 2, generator=g, dtype=torch.float64) for _ in range(3))
    return x, v_s, v_t, torch.tensor([0.9, 0.5, 0.2]), torch.tensor([0.6, 0.3, 0.0])


def test_consistency_loss_compares_clean_predictions_and_stops_the_targets_gradient():
    x, v_s, v_t, sigma, sigma_next = _toy()
    student_v = v_s.clone().requires_grad_(True)
    target_v = v_t.clone().requires_grad_(True)
    loss = consistency_loss(clean_prediction(x, sigma, student_v), clean_prediction(x, sigma_next, target_v))
    s, s_next = sigma.double().view(-1, 1, 1, 1), sigma_next.double().view(-1, 1, 1, 1)
    expected = ((x - s * v_s) - (x - s_next * v_t)).pow(2).mean()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    loss.backward()
    assert target_v.grad is None or not target_v.grad.any()
    diff = (x - s * v_s) - (x - s_next * v_t)
    torch.testing.assert_close(student_v.grad.double(), -2 * s * diff / diff.numel(), rtol=1e-5, atol=1e-7)
    # at sigma_next = 0 the target is the point itself, whatever the target network says
    torch.testing.assert_close(clean_prediction(x, sigma_next, v_t)[2], x[2].float())


def test_kd_loss_is_half_the_mse_of_the_clean_prediction_to_the_teacher_endpoint():
    x, v, x0_t, sigma, _ = _toy(1)
    s = sigma.double().view(-1, 1, 1, 1)
    assert float(kd_loss(v, x, sigma, x0_t)) == pytest.approx(float(0.5 * ((x - s * v - x0_t) ** 2).mean()), rel=1e-6)


@pytest.mark.parametrize("self_normalize", [False, True])
def test_opd_v_and_x0_errors(self_normalize):
    x, v_s, v_t, sigma, sigma_next = _toy(2)
    s = sigma.double().view(-1, 1, 1, 1)
    for target, error in (("v", v_s - v_t), ("x0", (x - s * v_s) - (x - s * v_t))):
        expected = error.pow(2).flatten(1).mean(1)
        if self_normalize:
            expected = expected / (error.abs().flatten(1).mean(1) + 1e-8)
        got = opd_loss(v_s, v_t, x, sigma, sigma_next, target=target, self_normalize=self_normalize)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)


def test_opd_xt_is_the_gaussian_kl_of_the_two_transitions():
    x, v_s, v_t, sigma, sigma_next = _toy(3)
    s, s_next = sigma.double().view(-1, 1, 1, 1), sigma_next.double().view(-1, 1, 1, 1)
    ode = opd_loss(v_s, v_t, x, sigma, sigma_next, target="xt", dynamics="ode")
    mean_gap = (s_next - s) * (v_s - v_t)  # Euler means; unit variance for the ODE
    torch.testing.assert_close(ode.double(), 0.5 * mean_gap.pow(2).flatten(1).mean(1), rtol=1e-5, atol=1e-7)
    a = 0.7
    sde = opd_loss(v_s, v_t, x, sigma, sigma_next, target="xt", dynamics="flow-sde", noise_level=a)
    g = a * torch.sqrt(s / (1 - s))
    drift_gap = (v_s - v_t) * (1 + g**2 * (1 - s) / (2 * s))  # the drift is affine in v
    variance = g**2 * (s - s_next)
    expected = (((s_next - s) * drift_gap) ** 2 / (2 * variance)).flatten(1).mean(1)
    torch.testing.assert_close(sde.double(), expected, rtol=1e-4, atol=1e-7)


@pytest.fixture(scope="module")
def tiny() -> tuple[TinySD3Adapter, TinySD3State]:
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=TINY)
    g = torch.Generator().manual_seed(0)
    return adapter, TinySD3State(torch.randn(2, 16, 384, generator=g), torch.randn(2, 384, generator=g))


def test_sub_steps_are_equal_euler_steps_of_the_model(tiny):
    adapter, state = tiny
    x = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    sigma, sigma_next = torch.tensor([0.9, 0.6]), torch.tensor([0.3, 0.0])
    expected = x.clone()
    with torch.no_grad():
        for k in range(3):
            here = sigma + (sigma_next - sigma) * k / 3
            there = sigma + (sigma_next - sigma) * (k + 1) / 3
            expected = expected + (there - here).view(-1, 1, 1, 1) * adapter.forward(expected, here, state)
    torch.testing.assert_close(solve_ode(adapter, x, sigma, sigma_next, state, substeps=3), expected)
    grid = torch.tensor([1.0, 0.5, 0.0])
    states = ode_states(adapter, x, state, grid, substeps=2)
    assert states.shape == (2, 3, 1, 16, 16)
    torch.testing.assert_close(states[:, 2], solve_ode(adapter, states[:, 1], 0.5, 0.0, state, substeps=2))


def test_the_teachers_velocity_is_its_own_or_its_average_over_the_step(tiny):
    adapter, state = tiny
    adapter.snapshots.capture(Snapshot.TEACHER, adapter.module())
    x = torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    sigma, sigma_next = torch.tensor([0.8, 0.4]), torch.tensor([0.4, 0.0])
    with torch.no_grad():
        own = adapter.forward(x, sigma, state)
    torch.testing.assert_close(teacher_velocity(adapter, x, sigma, sigma_next, state), own, rtol=0, atol=0)
    landed = solve_ode(adapter, x, sigma, sigma_next, state, substeps=4)
    average = teacher_velocity(adapter, x, sigma, sigma_next, state, substeps=4)
    torch.testing.assert_close(x - (sigma - sigma_next).view(-1, 1, 1, 1) * average, landed, rtol=1e-5, atol=1e-5)
