"""MixGRPO: the sliding window's schedule, what a rollout stores and trains, its ODE outside the window,
the replay ratio, validation, and exact resume mid-schedule."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.config.loading import load_pipeline
from flowpost.core.diagnostics import check_consistency
from flowpost.core.events import read_events
from flowpost.core.trainers.rl.mixgrpo import MixGRPOTrainer, compressed_grid, window_start
from flowpost.errors import FlowpostError

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


def _reference_starts(iterations: int, *, low: int, high: int, stride: int, interval: int) -> list[int]:
    """The window starts of MixGRPO's stateful progressive schedule with roll-back (``grpo_states.py``):
    read the start, then count the iteration; every ``interval`` counts move it by ``stride``, back to
    ``low`` once past ``high``."""
    current, counted, starts = low, 0, []
    for _ in range(iterations):
        starts.append(current)
        counted += 1
        if counted >= interval:
            counted, current = 0, current + stride
        if current > high:
            current, counted = low, 0
    return starts


@pytest.mark.parametrize(
    ("low", "high", "stride", "interval"), [(0, 21, 1, 25), (0, 5, 2, 3), (2, 6, 1, 1), (0, 3, 0, 4)]
)
def test_the_window_slides_by_its_stride_and_rolls_back_as_the_reference_counter(low, high, stride, interval):
    count = 3 * interval * (high - low + 2)
    expected = _reference_starts(count, low=low, high=high, stride=stride, interval=interval)
    starts = [window_start(i, starts=(low, high), stride=stride, interval=interval) for i in range(count)]
    assert starts == expected
    assert low in starts and max(starts) <= high
    if stride:  # it moves, and comes back to low after passing the range's end
        assert starts[interval] == low + stride and starts.count(low) > interval


def test_the_engine_samples_the_scheduled_window_and_stores_and_trains_only_its_steps(make_trainer, tmp_path):
    trainer = make_trainer(
        tmp_path,
        cls=MixGRPOTrainer,
        rewards=JPEG,
        sampling={"steps": 6, "window": 2},
        shift_interval=2,
        **SMALL,
    )
    assert [trainer.rollouts.window(i) for i in (0, 1, 2, 5, 6, 7, 8)] == [
        range(0, 2),
        range(0, 2),
        range(1, 3),
        range(2, 4),
        range(3, 5),
        range(3, 5),
        range(0, 2),  # starts 0..3 (the window ends before the last step), then rolled back
    ]
    trainer.progress = trainer.progress.after_rollout().after_rollout()  # iteration 2: the window is [1, 3)
    rollout = trainer.sample()
    assert rollout.steps.tolist() == [1, 2]
    assert rollout.latents.shape[1] == rollout.log_probs.shape[1] == 2
    sigmas = trainer.adapter.inference_sigmas(6)
    assert torch.equal(rollout.sigmas, sigmas[1:3]) and torch.equal(rollout.sigmas_next, sigmas[2:4])
    trainer.rollouts.score(rollout)
    before = {k: v.clone() for k, v in trainer.adapter.module().state_dict().items()}
    metrics = trainer.optimize(rollout)
    assert metrics["window/start"] == 1.0 and "clip_fraction" in metrics
    after = trainer.adapter.module().state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("solver", ["euler", "dpm2"])
def test_the_replayed_ratio_is_one_before_any_update(make_trainer, tmp_path, solver):
    trainer = make_trainer(
        tmp_path,
        cls=MixGRPOTrainer,
        rewards=JPEG,
        sampling={"steps": 8, "window": 2},
        ode_solver=solver,
        ode_compress=0.5,
        **SMALL,
    )
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5 and report["steps"] == [0, 1]


def test_dpm2_after_the_window_changes_only_what_follows_it(make_trainer, tmp_path):
    rollouts = {}
    for solver in ("euler", "dpm2"):
        trainer = make_trainer(
            tmp_path / solver,
            cls=MixGRPOTrainer,
            rewards=JPEG,
            sampling={"steps": 8, "window": 2},
            ode_solver=solver,
            **SMALL,
        )
        rollouts[solver] = trainer.sample()
    euler, dpm2 = rollouts["euler"], rollouts["dpm2"]
    for key in ("latents", "next_latents", "log_probs"):  # Euler before the window, the same SDE steps in it
        assert torch.equal(getattr(euler, key), getattr(dpm2, key))
    assert torch.isfinite(dpm2.final).all() and not torch.equal(euler.final, dpm2.final)


def test_the_compressed_grid_keeps_the_window_and_thins_the_rest_on_the_model_grid():
    sigmas = torch.linspace(1.0, 0.0, 26)
    grid = compressed_grid(sigmas, 4, 0.4)  # MixGRPO-Flash: 25 steps, window [0, 4): 22 points -> 8
    assert torch.equal(grid[:5], sigmas[:5]) and torch.equal(grid[4:], sigmas[4::3])
    assert len(grid) == 5 + 7 and float(grid[-1]) == 0.0
    assert torch.equal(compressed_grid(sigmas, 4, 1.0), sigmas)
    tiny = compressed_grid(sigmas, 20, 0.05)  # never fewer than one step to 0
    assert torch.equal(tiny, torch.cat([sigmas[:21], sigmas[-1:]]))


def _mixgrpo_errors(*overrides: str) -> str:
    base = ["stages.grpo.trainer=mixgrpo"]
    with pytest.raises(FlowpostError) as info:
        load_pipeline(None, [*base, *overrides])
    return str(info.value)


def test_validation_names_the_config_path_of_each_problem():
    assert "stages.grpo.sampling.window: trainer 'mixgrpo' slides a window" in _mixgrpo_errors(
        "stages.grpo.sampling.window=null"
    )
    assert "stages.grpo.sampling" in _mixgrpo_errors("stages.grpo.sampling.window=12")  # 10 steps
    assert "stages.grpo.train.ode_compress" in _mixgrpo_errors("stages.grpo.train.ode_compress=0")
    assert "stages.grpo.train.shift_interval" in _mixgrpo_errors("stages.grpo.train.shift_interval=0")
    assert "stages.grpo.train.ode_solver" in _mixgrpo_errors("stages.grpo.train.ode_solver=heun")
    pipeline = load_pipeline(None, ["stages.grpo.trainer=mixgrpo", "stages.grpo.sampling.window=4"])
    assert pipeline.stages["grpo"].train["shift_interval"] == 25


def test_a_trainer_built_without_a_window_is_refused(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match=r"stages\.sft\.sampling\.window"):
        make_trainer(tmp_path, cls=MixGRPOTrainer, rewards=JPEG, sampling={"steps": 4}, **SMALL)


def test_a_stage_resumed_mid_schedule_samples_the_same_windows_and_ends_at_identical_weights(make_trainer, tmp_path):
    settings = {
        "rewards": JPEG,
        "sampling": {"steps": 5, "window": 2},
        "shift_interval": 1,
        "window_stride": 1,
        "iterations": 4,
        "lr": 1e-3,
        "log_every": 1,
        **SMALL,
    }
    straight = make_trainer(tmp_path / "straight", cls=MixGRPOTrainer, resume=False, **settings)
    straight.start()
    first = make_trainer(tmp_path / "resumed", cls=MixGRPOTrainer, checkpoint_every=1, **{**settings, "iterations": 2})
    first.start()
    resumed = make_trainer(tmp_path / "resumed", cls=MixGRPOTrainer, checkpoint_every=1, **settings)
    resumed.start()

    def starts(folder: str) -> list[float]:
        events = read_events(tmp_path / folder / "events.jsonl")
        return [e["metrics"]["window/start"] for e in events if e["event"] == "progress"]

    assert starts("straight") == [0.0, 1.0, 2.0, 0.0]  # starts 0..2 on 5 steps, rolled back at iteration 3
    assert starts("resumed") == starts("straight")
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
