"""Flow-SDE on Wan's UniPC flow-sigma grids, whose first sigma is ``1 - 1e-6``, and the load-time check
that every SDE step of a stage's own grid has a bounded std."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_wan2_pipeline import load_wan2_adapter

from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.sampling.sde import sde_step
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.nft import NFTTrainer
from flowpost.core.trainers.rl.rollout import sample_trajectory
from flowpost.errors import FlowpostError

# The published scheduler/scheduler_config.json of Wan2.1-T2V-1.3B-Diffusers (flow_shift 3.0) and
# Wan2.2-TI2V-5B-Diffusers (flow_shift 5.0).
WAN_UNIPC: dict[str, Any] = {
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero",
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "predict_x0": True,
    "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_p": None,
    "solver_type": "bh2",
    "steps_offset": 0,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "trained_betas": None,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}
WAN21 = {**WAN_UNIPC, "flow_shift": 3.0}
WAN22_TI2V = {**WAN_UNIPC, "flow_shift": 5.0, "time_shift_type": "exponential", "use_dynamic_shifting": False}
CONFIGS = pytest.mark.parametrize("config", [WAN21, WAN22_TI2V], ids=["wan2.1-t2v", "wan2.2-ti2v"])
DEFAULT = SamplingConfig()
BOUND = 1.0  # a healthy Flow-SDE step at noise_level 0.7 has std <= ~0.75 on unit-variance latents
SMALL = {"prompts_per_iteration": 2, "group_size": 2, "rollout_batch_size": 4, "train_batch_size": 2}
SAMPLED_JPEG = [{"name": "jpeg_incompressibility", "frames": "sampled", "sampled_frames": 3}]


def _grid(config: dict[str, Any], steps: int) -> torch.Tensor:
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(**config)
    scheduler.set_timesteps(steps)
    return scheduler.sigmas.float()


@CONFIGS
@pytest.mark.parametrize("steps", [DEFAULT.steps, 20, 50])
def test_every_flow_sde_step_of_the_unipc_grid_is_bounded(config: dict[str, Any], steps: int) -> None:
    sigmas = _grid(config, steps)
    assert 1.0 - 2e-6 < float(sigmas[0]) < 1.0  # UniPC moves its first sigma off 1
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 2, 8, 8, generator=gen)  # unit-variance latents
    v = torch.randn(x.shape, generator=gen)
    for j in range(steps - 1):  # every step a window may hold (the last is never SDE)
        out = sde_step("flow-sde", v, x, sigmas[j], sigmas[j + 1], noise_level=DEFAULT.noise_level, generator=gen)
        drawn = float((out.prev_sample - out.mean).std())
        assert float(out.std) <= BOUND and drawn <= BOUND, (j, float(out.std), drawn)
        assert bool(out.mean.isfinite().all()) and bool(out.log_prob.isfinite().all())


@CONFIGS
def test_the_first_unipc_step_is_the_sigma_one_step(config: dict[str, Any]) -> None:
    """``1 - 1e-6`` counts as pure noise: its std is what the step from exactly 1 would have."""
    sigmas = _grid(config, DEFAULT.steps)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    nudged = sde_step("flow-sde", x, x, sigmas[0], sigmas[1], noise_level=0.7, noise=x)
    exact = sde_step("flow-sde", x, x, 1.0, sigmas[1], noise_level=0.7, noise=x)
    torch.testing.assert_close(nudged.std, exact.std, rtol=1e-4, atol=0)  # Delta differs by 1e-6
    torch.testing.assert_close(nudged.prev_sample, exact.prev_sample, rtol=1e-4, atol=1e-4)


def _unipc_folder(wan2_pipeline_dir: Path, folder: Path, config: dict[str, Any]) -> Path:
    from diffusers import UniPCMultistepScheduler

    shutil.copytree(wan2_pipeline_dir, folder)
    shutil.rmtree(folder / "scheduler")
    UniPCMultistepScheduler(**config).save_pretrained(folder / "scheduler")
    return folder


@CONFIGS
def test_a_unipc_wan2_folder_rolls_out_with_bounded_steps(
    config: dict[str, Any], wan2_pipeline_dir: Path, tmp_path: Path
) -> None:
    adapter = load_wan2_adapter(_unipc_folder(wan2_pipeline_dir, tmp_path / "unipc", config))
    assert type(adapter.scheduler).__name__ == "UniPCMultistepScheduler"
    sigmas = adapter.inference_sigmas(DEFAULT.steps)
    assert float(sigmas[0]) < 1.0
    state = adapter.prepare_condition_state(adapter.encode_conditions(["a red cat", "a blue dog"]))
    shape = (2, *adapter.latent_shape)
    gen = torch.Generator().manual_seed(0)
    window = range(DEFAULT.steps - 1)
    traj = sample_trajectory(
        adapter,
        torch.randn(shape, generator=gen),
        state,
        sigmas,
        window=window,
        step_noise={j: torch.randn(shape, generator=gen) for j in window},
        dynamics="flow-sde",
        noise_level=DEFAULT.noise_level,
    )
    drawn = (traj["next_latents"] - traj["means"]).flatten(2).std(dim=2)  # [B, steps]
    assert float(drawn.max()) <= BOUND, drawn
    assert float(traj["final"].abs().max()) < 20.0
    for i, j in enumerate(window):  # replaying a stored transition gives its log-prob back
        velocity = adapter.forward(traj["latents"][:, i], sigmas[j], state)
        replay = sde_step(
            "flow-sde",
            velocity,
            traj["latents"][:, i],
            sigmas[j],
            sigmas[j + 1],
            noise_level=DEFAULT.noise_level,
            prev_sample=traj["next_latents"][:, i],
        )
        torch.testing.assert_close(replay.log_prob, traj["log_probs"][:, i], rtol=1e-5, atol=1e-5)


def _broken(adapter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The family grid from a scheduler whose first sigma sits 3e-4 below 1 (Wan's original flow UniPC
    starts at ``shift(1 - 1/1000)``): too far from 1 to count as pure noise, a first-step std of 7.6."""
    grid = adapter.inference_sigmas

    def sigmas(steps: int) -> torch.Tensor:
        out = grid(steps).clone()
        out[0] = 1.0 - 3e-4
        return out

    monkeypatch.setattr(adapter, "inference_sigmas", sigmas)


@pytest.mark.parametrize("trainer", [GRPOTrainer, NFTTrainer])
def test_a_stage_whose_grid_breaks_a_flow_sde_step_is_refused_at_load(
    trainer: type, make_trainer, tmp_path, wan2_pipeline_dir, wan2_data_dirs, monkeypatch
) -> None:
    adapter = load_wan2_adapter(_unipc_folder(wan2_pipeline_dir, tmp_path / "unipc", WAN21))
    _broken(adapter, monkeypatch)
    with pytest.raises(FlowpostError, match=r"stages\.sft\.sampling: .*step 0 .*std") as raised:
        make_trainer(
            tmp_path / "out",
            cls=trainer,
            adapter=adapter,
            dirs=wan2_data_dirs,
            rewards=SAMPLED_JPEG,
            sampling={"steps": DEFAULT.steps},
            iterations=1,
            **SMALL,
        )
    assert raised.value.where == "stages.sft.sampling"
    assert "window_start" in str(raised.value)  # says what to change


def test_a_window_past_the_broken_step_or_the_ode_loads(
    make_trainer, tmp_path, wan2_pipeline_dir, wan2_data_dirs, monkeypatch
) -> None:
    adapter = load_wan2_adapter(_unipc_folder(wan2_pipeline_dir, tmp_path / "unipc", WAN21))
    _broken(adapter, monkeypatch)
    for n, sampling in enumerate(
        [{"steps": DEFAULT.steps, "window": 2, "window_start": [1, 4]}, {"steps": DEFAULT.steps, "dynamics": "ode"}]
    ):
        make_trainer(
            tmp_path / f"out{n}",
            cls=NFTTrainer,
            adapter=adapter,
            dirs=wan2_data_dirs,
            rewards=SAMPLED_JPEG,
            sampling=sampling,
            iterations=1,
            **SMALL,
        )


def test_the_unipc_wan2_grid_loads_a_grpo_stage(make_trainer, tmp_path, wan2_pipeline_dir, wan2_data_dirs) -> None:
    adapter = load_wan2_adapter(_unipc_folder(wan2_pipeline_dir, tmp_path / "unipc", WAN21))
    trainer = make_trainer(
        tmp_path / "out",
        cls=GRPOTrainer,
        adapter=adapter,
        dirs=wan2_data_dirs,
        rewards=SAMPLED_JPEG,
        sampling={"steps": DEFAULT.steps},
        iterations=1,
        **SMALL,
    )
    assert float(trainer.adapter.inference_sigmas(DEFAULT.steps)[0]) < 1.0
