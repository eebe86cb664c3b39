"""Tracker cadence and dvclive history across a resumed stage."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from flowpost.core.callbacks.tracking import DVCLiveTracker, RunIdentity, TrackingCallback, flat_numbers


class _Recorder:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.steps.append(step)

    def image(self, key: str, path: Path, step: int) -> None:
        pass

    def summary(self, values: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def test_metrics_are_logged_every_log_every_steps_and_at_the_final_step(tmp_path: Path) -> None:
    callback = TrackingCallback([], tmp_path, RunIdentity("p", "sft", "sft", "tiny-sd3", tmp_path))
    recorder = _Recorder()
    callback.trackers = [recorder]
    trainer = SimpleNamespace(args=SimpleNamespace(log_every=5), budget=12, progress=SimpleNamespace())
    for step in range(1, 13):
        trainer.progress.optimizer_step = trainer.completed_units = step
        callback.on_step_end(trainer, {"loss": 1.0})  # type: ignore[arg-type]
    assert recorder.steps == [5, 10, 12]


def test_a_resumed_dvclive_tracker_keeps_the_earlier_history(tmp_path: Path) -> None:
    first = DVCLiveTracker(tmp_path / "dvclive")
    for step in (1, 2):
        first.log({"loss": float(step)}, step)
    first.close()
    resumed = DVCLiveTracker(tmp_path / "dvclive")
    resumed.log({"loss": 3.0}, 3)
    resumed.close()
    (history,) = (tmp_path / "dvclive").rglob("loss.tsv")
    steps = [line.split("\t")[0] for line in history.read_text().splitlines()[1:]]
    assert steps == ["1", "2", "3"]


def test_the_cost_ledger_becomes_flat_scalars() -> None:
    cost = {"wall_seconds": 2.5, "phases": {"rollout": 1.0, "reward": 0.5}, "memory_kind": "cpu_peak_rss", "runs": 2}
    assert flat_numbers(cost, "cost") == {
        "cost/wall_seconds": 2.5,
        "cost/phases/rollout": 1.0,
        "cost/phases/reward": 0.5,
        "cost/runs": 2.0,
    }
