"""Every tensor a sampling step creates takes the latents' device, checked without a GPU.

The network and the latents live on the ``meta`` device while the sigma tables stay on the CPU, as
the trainers keep them; every torch call inside the rollout, the replay and the ODE must then see
tensors of one device only (even the 0-dim CPU tensors that CUDA would tolerate).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from one_device import OneDevice

from flowpost.core.models.tiny_sd3 import TinySD3Adapter, TinySD3State
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import inference_sigmas
from flowpost.core.sampling.sde import sde_step
from flowpost.core.trainers.rl.rollout import sample_trajectory

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}
META = torch.device("meta")
BATCH = 2


@pytest.fixture
def on_meta() -> Iterator[tuple[TinySD3Adapter, TinySD3State, TinySD3State]]:
    """The adapter on ``meta``, with positive and negative condition states there."""
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=TINY)
    adapter.module().to(META)

    def state() -> TinySD3State:
        return TinySD3State(torch.zeros(BATCH, 16, 384, device=META), torch.zeros(BATCH, 384, device=META))

    yield adapter, state(), state()


def test_the_checker_catches_a_cpu_scalar_mixed_into_meta_math() -> None:
    with pytest.raises(AssertionError, match="mixes tensors"), OneDevice():
        torch.ones(3, device=META) * torch.tensor(2.0)


@pytest.mark.parametrize("dynamics", ["flow-sde", "cps"])
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_a_rollout_and_the_replay_of_a_stored_step_stay_on_the_latents_device(on_meta, dynamics, guidance):
    adapter, state, negative = on_meta
    sigmas = inference_sigmas(4)
    noise = torch.zeros(BATCH, 1, 16, 16, device=META)
    with OneDevice():
        stored = sample_trajectory(
            adapter,
            noise,
            state,
            sigmas,
            window=range(1, 3),
            step_noise={j: torch.zeros_like(noise) for j in range(1, 3)},
            dynamics=dynamics,
            noise_level=0.7,
            guidance=guidance,
            negative=negative,
        )
        x, target = stored["latents"][:, 0], stored["next_latents"][:, 0]
        per_sample = sigmas[1].repeat(BATCH), sigmas[2].repeat(BATCH)  # as replay passes them, one per row
        velocity = adapter.forward(x, per_sample[0], state, guidance=guidance, negative=negative)
        replay = sde_step(dynamics, velocity, x, *per_sample, noise_level=0.7, prev_sample=target)
    assert {t.device for t in (*stored.values(), replay.log_prob, replay.mean, replay.std)} == {META}


def test_the_ode_stays_on_the_latents_device(on_meta):
    adapter, state, negative = on_meta
    with OneDevice():
        latents = sample_ode(
            adapter,
            torch.zeros(BATCH, 1, 16, 16, device=META),
            state,
            inference_sigmas(3),
            guidance=2.0,
            negative=negative,
        )
    assert latents.device == META


def test_a_rollout_with_dpm2_after_its_window_stays_on_the_latents_device(on_meta):
    adapter, state, _ = on_meta
    noise = torch.zeros(BATCH, 1, 16, 16, device=META)
    with OneDevice():
        stored = sample_trajectory(
            adapter,
            noise,
            state,
            inference_sigmas(6),
            window=range(1, 3),
            step_noise={j: torch.zeros_like(noise) for j in range(1, 3)},
            dynamics="flow-sde",
            noise_level=0.7,
            ode_solver="dpm2",
        )
    assert {t.device for t in stored.values()} == {META}


def test_the_teachers_sub_stepped_ode_and_the_distillation_losses_stay_on_the_latents_device(on_meta):
    from flowpost.core.sampling.substeps import ode_states
    from flowpost.core.snapshots import Snapshot
    from flowpost.core.trainers.distill.consistency import clean_prediction, consistency_loss
    from flowpost.core.trainers.distill.kd import kd_loss
    from flowpost.core.trainers.distill.opd import opd_loss
    from flowpost.core.trainers.distill.teacher import teacher_velocity

    adapter, state, negative = on_meta
    adapter.snapshots.capture(Snapshot.TEACHER, adapter.module())
    x = torch.zeros(BATCH, 1, 16, 16, device=META)
    sigma, sigma_next = torch.tensor([0.8, 0.5]), torch.tensor([0.4, 0.0])  # a CPU sigma table's rows
    with OneDevice():
        states = ode_states(adapter, x, state, inference_sigmas(2), substeps=2, guidance=2.0, negative=negative)
        average = teacher_velocity(adapter, x, sigma, sigma_next, state, substeps=2, guidance=2.0, negative=negative)
        losses = [
            opd_loss(average, average, x, sigma, sigma_next, target=target, dynamics="flow-sde", noise_level=0.7)
            for target in ("xt", "v", "x0")
        ]
        losses.append(consistency_loss(clean_prediction(x, sigma, average), clean_prediction(x, sigma_next, average)))
        losses.append(kd_loss(average, x, sigma, x))
    assert {t.device for t in (states, average, *losses)} == {META}


def test_the_teachers_ode_keeps_the_latents_dtype():
    from flowpost.core.sampling.substeps import solve_ode

    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=TINY)
    adapter.module().to(torch.float64)
    state = TinySD3State(torch.zeros(BATCH, 16, 384, dtype=torch.float64), torch.zeros(BATCH, 384, dtype=torch.float64))
    x = torch.randn(BATCH, 1, 16, 16, dtype=torch.float64)
    landed = solve_ode(adapter, x, torch.tensor([0.9, 0.7]), torch.tensor([0.5, 0.2]), state, substeps=3)
    assert landed.dtype == torch.float64
