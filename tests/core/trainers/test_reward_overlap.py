"""``train.overlap_rewards``: forward batches scored on a worker thread while the next one samples, with the
same rewards, advantages, losses and errors as scoring them after the rollout."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from flowpost.core.events import read_events
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.errors import FlowpostError

REWARDS = [{"name": "jpeg_incompressibility"}, {"name": "mean_brightness", "weight": 0.5}]
TWO_FORWARDS = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 4, "train_batch_size": 4}


class RecordingReward:
    """Mean brightness, recording each call's thread and prompts; ``fail_on`` raises on that call."""

    name = "recording"

    def __init__(self, fail_on: int | None = None, started: threading.Event | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_on = fail_on
        self.started = started

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        self.calls.append((threading.current_thread().name, list(prompts)))
        if self.started is not None:
            self.started.set()
        if len(self.calls) - 1 == self.fail_on:
            raise ValueError(f"no score for {prompts[0]!r}")
        return media.flatten(1).mean(1)


def _trainer(make_trainer, out: Path, overlap: bool, **args: Any) -> GRPOTrainer:
    settings = {"rewards": REWARDS, "sampling": {"steps": 4}, **TWO_FORWARDS, **args}
    return make_trainer(out, cls=GRPOTrainer, overlap_rewards=overlap, **settings)


def test_overlap_gives_the_same_rewards_advantages_losses_and_weights(make_trainer, tmp_path: Path) -> None:
    runs = []
    for overlap in (False, True):
        out = tmp_path / str(overlap)
        trainer = _trainer(
            make_trainer, out, overlap, iterations=1, log_every=1, kl_beta=0.1, replay_steps_per_pass="auto"
        )
        assert (trainer.rollouts.overlap is not None) is overlap
        rollout = trainer.sample()
        scored = trainer.rollouts.score(rollout)
        trainer.start()
        steps = [e["metrics"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]
        runs.append((rollout, scored, steps, trainer.adapter.module().state_dict()))
    (off, off_metrics, off_steps, off_weights), (on, on_metrics, on_steps, on_weights) = runs
    assert torch.equal(on.rewards, off.rewards) and torch.equal(on.advantages, off.advantages)
    assert float(off.advantages.abs().max()) > 0
    assert on_metrics == off_metrics
    assert len(on_steps) == 1 and on_steps == off_steps  # losses, rewards, advantages
    assert on_steps[0]["replay/steps_per_pass"] >= 1  # the width auto chose, recorded
    for name, tensor in off_weights.items():
        assert torch.equal(on_weights[name], tensor), name


def test_each_forward_batch_is_scored_on_the_worker_while_the_next_one_samples(make_trainer, tmp_path: Path) -> None:
    trainer = _trainer(make_trainer, tmp_path, True)
    started = threading.Event()
    reward = RecordingReward(started=started)
    trainer.rollouts.rewards = WeightedRewards([(reward, 1.0)], where="stages.sft.rewards")
    steps, forward = trainer.sampling.steps, trainer.adapter.forward
    calls = {"n": 0, "waited": None}

    def forward_after_first_batch(*args: Any, **kwargs: Any) -> Tensor:
        calls["n"] += 1
        if calls["n"] == steps + 1:  # the second forward batch's first step: the first batch is being scored
            calls["waited"] = started.wait(timeout=30)
        return forward(*args, **kwargs)

    trainer.sample()  # a rollout left unscored: the next one's scores are its own
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    assert torch.equal(rollout.rewards, trainer.adapter.decode(rollout.final).flatten(1).mean(1))
    reward.calls.clear()
    started.clear()
    trainer.adapter.forward = forward_after_first_batch  # type: ignore[method-assign]
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    assert calls["waited"] is True  # the first batch's scorer ran while the second batch was sampling
    assert [name for name, _ in reward.calls] == ["flowpost-rewards_0"] * 2
    assert [p for _, prompts in reward.calls for p in prompts] == rollout.prompts  # in forward-batch order
    assert torch.equal(rollout.rewards, trainer.adapter.decode(rollout.final).flatten(1).mean(1))


def test_a_scorer_error_in_the_worker_reaches_the_loop_with_the_same_message(make_trainer, tmp_path: Path) -> None:
    messages = []
    for overlap in (False, True):
        trainer = _trainer(make_trainer, tmp_path / str(overlap), overlap)
        trainer.rollouts.rewards = WeightedRewards([(RecordingReward(fail_on=1), 1.0)], where="stages.sft.rewards")
        rollout = trainer.sample()
        with pytest.raises(FlowpostError) as raised:
            trainer.rollouts.score(rollout)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert "reward 'recording' raised ValueError: no score for" in messages[0]
    assert "stages.sft.rewards.0" in messages[0]
