"""Metric tracking to TensorBoard, dvclive and (when installed) Weights & Biases: the logged metrics (every
reward's own curve among them), the validation grids as images, and the stage's cost ledger at its end."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flowpost.core.callbacks.base import Callback, TrainerView
from flowpost.errors import FlowpostError

WHERE = "callbacks.trackers"


@dataclass(frozen=True)
class RunIdentity:
    """Who a tracked run is: its pipeline, stage, trainer and model family, and the stage's folder (a resumed
    stage continues the same run)."""

    pipeline: str
    stage: str
    trainer: str
    family: str
    output_dir: Path

    @property
    def name(self) -> str:
        return f"{self.pipeline}/{self.stage}"


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def image(self, key: str, path: Path, step: int) -> None: ...
    def summary(self, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def image(self, key: str, path: Path, step: int) -> None:
        import numpy as np
        from PIL import Image

        self.writer.add_image(key, np.asarray(Image.open(path).convert("RGB")), step, dataformats="HWC")
        self.writer.flush()

    def summary(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, 0)
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

    def image(self, key: str, path: Path, step: int) -> None:
        self.live.log_image(f"{key}/step-{step}.png", str(path))

    def summary(self, values: dict[str, float]) -> None:
        self.live.summary.update(values)

    def close(self) -> None:
        self.live.end()


class WandbTracker:
    """One W&B run per stage: project ``WANDB_PROJECT`` or the pipeline's name, entity ``WANDB_ENTITY``, named
    ``<pipeline>/<stage>``, grouped by pipeline and tagged with the stage, trainer and family; the mode is
    W&B's own (``WANDB_MODE``: online unless set). A resumed stage continues its run."""

    def __init__(self, log_dir: Path, identity: RunIdentity) -> None:
        import wandb

        log_dir.mkdir(parents=True, exist_ok=True)
        run_id = hashlib.sha256(str(identity.output_dir.resolve()).encode()).hexdigest()[:16]
        mode = os.environ.get("WANDB_MODE") or "online"  # read here: W&B keeps the first run's settings per process
        try:
            self.run = wandb.init(
                dir=str(log_dir),
                mode=mode,
                id=run_id,
                resume="allow",
                project=os.environ.get("WANDB_PROJECT") or identity.pipeline,
                entity=os.environ.get("WANDB_ENTITY") or None,
                name=identity.name,
                group=identity.pipeline,
                job_type=identity.trainer,
                tags=[identity.pipeline, identity.stage, identity.trainer, identity.family],
                config={"pipeline": identity.pipeline, "stage": identity.stage, "family": identity.family},
            )
        except Exception as exc:  # W&B raises its own usage and communication errors
            raise FlowpostError(
                f"the wandb tracker could not start a run in {mode} mode ({exc}); log in (wandb login, or "
                "WANDB_API_KEY) or set WANDB_MODE=offline",
                where=WHERE,
            ) from None
        self.wandb = wandb

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def image(self, key: str, path: Path, step: int) -> None:
        self.run.log({key: self.wandb.Image(str(path))}, step=step)

    def summary(self, values: dict[str, float]) -> None:
        self.run.summary.update(values)

    def close(self) -> None:
        self.run.finish()


def build_tracker(kind: str, log_dir: Path, identity: RunIdentity) -> Tracker:
    """The tracker named ``kind`` writing under ``log_dir``."""
    if kind == "tensorboard":
        return TensorBoardTracker(log_dir / "tensorboard")
    if kind == "dvclive":
        return DVCLiveTracker(log_dir / "dvclive")
    if kind == "wandb":
        if importlib.util.find_spec("wandb") is None:
            raise FlowpostError("tracker 'wandb' needs the wandb package; pip install flowpost[wandb]", where=WHERE)
        return WandbTracker(log_dir / "wandb", identity)
    raise FlowpostError(f"unknown tracker {kind!r}; use tensorboard, dvclive or wandb", where=WHERE)


def flat_numbers(values: dict[str, Any], prefix: str) -> dict[str, float]:
    """The numbers of a nested dict as ``prefix/key/subkey`` scalars (strings and other values left out)."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= flat_numbers(value, f"{prefix}/{key}")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[f"{prefix}/{key}"] = float(value)
    return flat


class TrackingCallback(Callback):
    """Logs to every configured tracker, rank 0 only: the step metrics at the event cadence (every
    ``log_every`` budget units and at the last), each validation grid as an image, and the cost ledger as the
    run's summary at the end."""

    def __init__(self, kinds: list[str], log_dir: Path, identity: RunIdentity) -> None:
        self.kinds = kinds
        self.log_dir = log_dir
        self.identity = identity
        self.trackers: list[Tracker] = []

    def on_train_start(self, trainer: TrainerView) -> None:
        if trainer.accelerator.is_main_process:
            self.trackers = [build_tracker(k, self.log_dir, self.identity) for k in self.kinds]

    def on_step_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        step = trainer.progress.optimizer_step
        done = trainer.completed_units
        if done % trainer.args.log_every == 0 or done == trainer.budget:
            for tracker in self.trackers:
                tracker.log(metrics, step)

    def on_validation_end(self, trainer: TrainerView, results: dict[str, Any]) -> None:
        step = trainer.progress.optimizer_step
        scalars = {f"validation/{k}": float(v) for k, v in results.items() if isinstance(v, (int, float))}
        for tracker in self.trackers:
            tracker.log(scalars, step)
            if "grid" in results:
                tracker.image("validation/grid", Path(results["grid"]), step)

    def on_train_end(self, trainer: TrainerView) -> None:
        cost = flat_numbers(trainer.cost, "cost") if trainer.cost else {}
        for tracker in self.trackers:
            if cost:
                tracker.summary(cost)
            tracker.close()
        self.trackers = []
