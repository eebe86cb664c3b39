"""Faults during a stage: non-finite steps, a failing reward, SIGTERM; each leaves the stage resumable."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch

from flowpost.core.callbacks.base import Callback
from flowpost.core.checkpoint import latest_checkpoint
from flowpost.core.events import read_events
from flowpost.core.trainers.offline.sft import SFTTrainer
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.stop import StageStopped, stop_on_sigterm
from flowpost.errors import FlowpostError


class PoisonedSFT(SFTTrainer):
    """Steps listed in ``bad`` (0-based optimizer steps) get a NaN loss (hence NaN gradients)."""

    bad: frozenset[int] = frozenset()

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        outputs = super().optimize_batch(batch)
        if self.progress.optimizer_step in self.bad:
            outputs["loss"] = outputs["loss"] * float("nan")
        return outputs


def _weights(trainer: SFTTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.adapter.module().state_dict().items()}


def _steps(out) -> list[dict[str, Any]]:  # noqa: ANN001
    return [e for e in read_events(out / "events.jsonl") if e["event"] == "progress"]


def test_a_non_finite_step_is_skipped_and_counted(make_trainer, tmp_path):
    PoisonedSFT.bad = frozenset({1})
    trainer = make_trainer(tmp_path, cls=PoisonedSFT, max_steps=3, log_every=1)
    before = {}

    class Record(Callback):
        def on_step_end(self, view, metrics):  # type: ignore[no-untyped-def]
            before[view.progress.optimizer_step] = _weights(trainer)

    trainer.callbacks.callbacks["record"] = Record()
    trainer.start()
    assert all(torch.equal(before[1][k], before[2][k]) for k in before[1])  # step 2 (index 1) changed nothing
    assert all(torch.isfinite(v).all() for v in before[3].values())
    assert [e["metrics"].get("skipped_steps") for e in _steps(tmp_path)] == [None, 1.0, 1.0]
    assert "lr" not in _steps(tmp_path)[1]["metrics"]


def test_finite_runs_are_unchanged_by_the_check(make_trainer, tmp_path):
    PoisonedSFT.bad = frozenset()
    guarded = make_trainer(tmp_path / "a", cls=PoisonedSFT, max_steps=3)
    guarded.start()
    plain = make_trainer(tmp_path / "b", max_steps=3)
    plain.bad_steps.is_bad = lambda *a: False  # type: ignore[method-assign]
    plain.start()
    a, b = _weights(guarded), _weights(plain)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_max_bad_steps_in_a_row_stop_the_stage_with_a_checkpoint(make_trainer, tmp_path):
    PoisonedSFT.bad = frozenset({2, 3})
    trainer = make_trainer(tmp_path, cls=PoisonedSFT, max_steps=6, max_bad_steps=2)
    with pytest.raises(FlowpostError, match="2 optimizer steps in a row had a non-finite loss or gradients") as info:
        trainer.start()
    assert info.value.where == "stages.sft.train.max_bad_steps"
    assert "checkpoint at optimizer step 4" in str(info.value)
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step-4"
    PoisonedSFT.bad = frozenset()
    assert make_trainer(tmp_path, cls=PoisonedSFT, max_steps=6).start().optimizer_step == 6


def test_sigterm_checkpoints_at_the_next_step_and_resumes_identically(make_trainer, tmp_path):
    class Terminate(Callback):
        def on_step_end(self, view, metrics):  # type: ignore[no-untyped-def]
            if view.progress.optimizer_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    straight = make_trainer(tmp_path / "straight", max_steps=4, resume=False)
    straight.start()
    stopped = make_trainer(tmp_path / "stopped", max_steps=4, listeners={"terminate": Terminate()})
    with stop_on_sigterm(), pytest.raises(StageStopped, match="stopped by SIGTERM at step 2,") as info:
        stopped.start()
    assert info.value.signum == signal.SIGTERM
    assert latest_checkpoint(tmp_path / "stopped" / "checkpoints").name == "step-2"
    resumed = make_trainer(tmp_path / "stopped", max_steps=4)
    resumed.start()
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


class FailOnSecondCall:
    def __init__(self, reward: Any) -> None:
        self.reward, self.name, self.calls = reward, reward.name, 0

    def __call__(self, *args: Any) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("scorer crashed")
        return self.reward(*args)


def test_a_reward_that_raises_stops_the_stage_resumable_from_its_last_checkpoint(make_trainer, tmp_path):
    settings = {
        "rewards": [{"name": "jpeg_incompressibility"}],
        "sampling": {"steps": 2},
        "iterations": 2,
        "checkpoint_every": 1,
        "prompts_per_iteration": 2,
        "group_size": 4,
        "rollout_batch_size": 8,
        "train_batch_size": 8,
    }
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, **settings)
    components = trainer.rollouts.rewards.components
    components[0] = (FailOnSecondCall(components[0][0]), components[0][1])
    crashed = "reward 'jpeg_incompressibility' raised RuntimeError: scorer crashed"
    with pytest.raises(FlowpostError, match=crashed) as info:
        trainer.start()
    assert info.value.where == "stages.sft.rewards.0"
    resumed = make_trainer(tmp_path, cls=GRPOTrainer, **settings)
    assert resumed.start().rollout_iteration == 2
    start = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "start"]
    assert start[-1]["resumed_from"] is not None and start[-1]["step"] == 1
