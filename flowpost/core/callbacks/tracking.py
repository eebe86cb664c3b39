"""Metric tracking to TensorBoard, dvclive and (when installed) Weights & Biases."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol

from flowpost.core.callbacks.base import Callback, TrainerView
from flowpost.errors import FlowpostError


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class DVCLiveTracker:
    def __init__(self, log_dir: Path) -> None:
        from dvclive import Live

        # resume: a stage restarted from a checkpoint appends to its history instead of wiping it
        self.live = Live(str(log_dir), resume=True, save_dvc_exp=False, dvcyaml=None, report=None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.live.step = step
        for key, value in metrics.items():
            self.live.log_metric(key, value)
        self.live.next_step()

    def close(self) -> None:
        self.live.end()


class WandbTracker:
    def __init__(self, log_dir: Path, *, name: str) -> None:
        import wandb

        self.run = wandb.init(dir=str(log_dir), name=name, mode="offline", reinit=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def build_tracker(kind: str, log_dir: Path, *, name: str) -> Tracker:
    """The tracker named ``kind`` writing under ``log_dir``."""
    if kind == "tensorboard":
        return TensorBoardTracker(log_dir / "tensorboard")
    if kind == "dvclive":
        return DVCLiveTracker(log_dir / "dvclive")
    if kind == "wandb":
        if importlib.util.find_spec("wandb") is None:
            raise FlowpostError(
                "tracker 'wandb' needs the wandb package; pip install wandb",
                where="callbacks.trackers",
            )
        return WandbTracker(log_dir / "wandb", name=name)
    raise FlowpostError(f"unknown tracker {kind!r}; use tensorboard, dvclive or wandb", where="callbacks.trackers")


class TrackingCallback(Callback):
    """Logs step metrics to every configured tracker, rank 0 only.

    Same cadence as the step events: every ``log_every`` steps and at the final step.
    """

    def __init__(self, kinds: list[str], log_dir: Path) -> None:
        self.kinds = kinds
        self.log_dir = log_dir
        self.trackers: list[Tracker] = []

    def on_train_start(self, trainer: TrainerView) -> None:
        if trainer.accelerator.is_main_process:
            self.trackers = [build_tracker(k, self.log_dir, name=trainer.stage) for k in self.kinds]

    def on_step_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        step = trainer.progress.optimizer_step
        done = trainer.completed_units
        if done % trainer.args.log_every == 0 or done == trainer.budget:
            for tracker in self.trackers:
                tracker.log(metrics, step)

    def on_validation_end(self, trainer: TrainerView, results: dict[str, Any]) -> None:
        scalars = {f"validation/{k}": float(v) for k, v in results.items() if isinstance(v, (int, float))}
        for tracker in self.trackers:
            tracker.log(scalars, trainer.progress.optimizer_step)

    def on_train_end(self, trainer: TrainerView) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
