"""Callbacks composed from the config: validation grids, trackers, gradient clipping, EMA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from flowpost.core.callbacks.base import Callback, CallbackList
from flowpost.core.callbacks.ema import ema_decay
from flowpost.core.trainers.offline.sft import SFTTrainer


def _run(make_trainer, out: Path, callbacks: dict, max_steps: int = 4) -> SFTTrainer:
    trainer = make_trainer(out, callbacks=callbacks, max_steps=max_steps, log_every=1)
    trainer.start()
    return trainer


def test_validation_writes_a_grid_at_its_cadence(make_trainer, tmp_path):
    validation = {"every": 2, "prompts": ["digit 1", "digit 2"], "samples_per_prompt": 3, "steps": 2}
    _run(make_trainer, tmp_path, {"validation": validation})
    grids = sorted(p.name for p in (tmp_path / "validation").glob("*.png"))
    assert grids == ["step-000002.png", "step-000004.png"]
    width, height = Image.open(tmp_path / "validation" / grids[0]).size
    assert width > height  # 3 samples a row, 2 prompts


def test_validation_prompt_missing_from_the_cache_is_a_clear_error(make_trainer, tmp_path):
    from flowpost.errors import FlowpostError

    with pytest.raises(FlowpostError, match="not-cached"):
        _run(make_trainer, tmp_path, {"validation": {"every": 1, "prompts": ["not-cached"]}})


def test_trackers_write_tensorboard_and_dvclive_logs(make_trainer, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    validation = {"every": 2, "prompts": ["digit 1"], "samples_per_prompt": 2, "steps": 2}
    _run(make_trainer, tmp_path, {"trackers": ["tensorboard", "dvclive"], "validation": validation})
    events = EventAccumulator(str(tmp_path / "logs" / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert [e.step for e in events.Images("validation/grid")] == [2, 4]
    assert "cost/wall_seconds" in events.Tags()["scalars"]
    loss_log = tmp_path / "logs" / "dvclive" / "plots" / "metrics" / "loss.tsv"
    assert len(loss_log.read_text().splitlines()) == 1 + 4  # header + one row per step
    images = sorted(p.name for p in (tmp_path / "logs" / "dvclive" / "plots" / "images").rglob("*.png"))
    assert images == ["step-2.png", "step-4.png"]


def test_gradient_clipping_reports_the_norm_and_clips(make_trainer, tmp_path):
    from flowpost.core.callbacks.grad_clip import GradClipCallback
    from flowpost.core.events import read_events

    trainer = _run(make_trainer, tmp_path, {"grad_clip": {"max_norm": 1e-3}}, max_steps=2)
    steps = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "progress"]
    assert len(steps) == 2 and all(e["metrics"]["grad_norm"] > 1e-3 for e in steps)

    batch = next(trainer.build_loader().iter_epoch(0))
    trainer.optimize_batch(batch)["loss"].backward()
    reported = GradClipCallback(max_norm=1e-3).on_before_optimizer_step(trainer)["grad_norm"]
    clipped = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in trainer.model.parameters() if p.grad is not None])
    )
    assert reported > 1e-3 and float(clipped) == pytest.approx(1e-3, rel=1e-3)


def test_ema_snapshot_follows_the_decay_schedule(make_trainer, fresh_weights, tmp_path):
    trainer = _run(make_trainer, tmp_path, {"ema": {"decay": 0.5, "schedule": "constant"}}, max_steps=1)
    initial = fresh_weights
    live = trainer.adapter.module().state_dict()
    ema = trainer.adapter.snapshots.state_dict("ema")
    for key, value in ema.items():
        torch.testing.assert_close(value, 0.5 * initial[key] + 0.5 * live[key])
    assert ema_decay(0.999, 0) == pytest.approx(0.1)
    assert ema_decay(0.999, 10_000) == 0.999
    assert ema_decay(0.9, 3, "constant") == 0.9
    assert ema_decay(0.9, 3, "linear", warmup_steps=10) == pytest.approx(0.27)
    assert ema_decay(0.9, 30, "linear", warmup_steps=10) == 0.9
    assert ema_decay(0.999, 7, "power", power=0.5) == pytest.approx(1 - 8**-0.5)
    assert ema_decay(0.5, 7, "power", power=0.5) == 0.5


class _Recorder(Callback):
    """Records the validation hooks it receives and counts steps (its checkpointed state)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.steps = 0

    def on_step_end(self, trainer, metrics):
        self.steps += 1

    def on_validation_begin(self, trainer):
        self.calls.append(("begin", trainer.progress.optimizer_step))

    def on_validation_end(self, trainer, results):
        self.calls.append(("end", results["step"]))
        assert Path(results["grid"]).is_file()

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state.get("steps", 0)


def test_the_loop_fires_the_validation_hooks_around_each_grid(make_trainer, tmp_path):
    recorder = _Recorder()
    validation = {"every": 2, "prompts": ["digit 1"], "samples_per_prompt": 1, "steps": 2}
    make_trainer(tmp_path, callbacks={"validation": validation}, listeners={"recorder": recorder}, max_steps=4).start()
    assert recorder.calls == [("begin", 2), ("end", 2), ("begin", 4), ("end", 4)]


def test_two_callbacks_of_one_class_keep_their_own_state_through_a_checkpoint(make_trainer, tmp_path):
    first, second = _Recorder(), _Recorder()
    second.steps = 100
    make_trainer(tmp_path, listeners={"first": first, "second": second}, max_steps=2).start()
    assert (first.steps, second.steps) == (2, 102)
    restored = {"first": _Recorder(), "second": _Recorder()}
    make_trainer(tmp_path, listeners=restored, max_steps=2).start()  # resumes at its budget: nothing trains
    assert (restored["first"].steps, restored["second"].steps) == (2, 102)


def test_callback_state_is_keyed_by_configured_name() -> None:
    assert CallbackList({"a": _Recorder(), "b": _Recorder()}).state_dict() == {"a": {"steps": 0}, "b": {"steps": 0}}
