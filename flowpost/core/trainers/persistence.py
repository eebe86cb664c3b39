"""Checkpoints, resume and final weights of a trainer (a mixin of ``BaseTrainer``).

Every rank builds the training state (gathering sharded weights is collective); rank 0 writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flowpost.core.checkpoint import TrainingState, latest_checkpoint, load_checkpoint, save_checkpoint
from flowpost.core.io import atomic_directory, write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.core.progress import TrainingProgress
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.callbacks.base import CallbackList
    from flowpost.core.events import EventLog
    from flowpost.core.models.base import ModelAdapter
    from flowpost.core.parallel import ParallelLayout

log = get_logger(__name__)


class PersistenceMixin:
    """``save_checkpoint``, ``_resume`` (latest intact checkpoint) and ``save_final_weights``."""

    accelerator: Any
    adapter: ModelAdapter
    args: Any
    callbacks: CallbackList
    completed_units: int
    events: EventLog
    model: torch.nn.Module
    optimizer: Any
    output_dir: Path
    parallel: ParallelLayout
    progress: TrainingProgress
    scheduler: Any
    stage: str
    _saved_progress: TrainingProgress | None = None
    _resumed_with: dict[str, Any] | None = None  # the checkpoint's world size and layout, when they differ

    def save_checkpoint(self) -> None:
        layout, snapshots = self.parallel, self.adapter.snapshots
        state = TrainingState(  # every rank builds it: gathering sharded weights is collective
            step=self.progress.optimizer_step,
            model=layout.model_state(self.model),
            optimizer=layout.optimizer_state(self.model, self.optimizer.optimizer),
            scheduler=self.scheduler.state_dict(),
            snapshots={n: layout.snapshot_state(snapshots.state_dict(n)) for n in snapshots.names()},
            rng={"torch": torch.get_rng_state()},
            trainer={
                "progress": self.progress.to_dict(),
                "callbacks": self.callbacks.state_dict(),
                "world_size": self.accelerator.num_processes,
                "layout": layout.name,
            },
        )
        if self.accelerator.is_main_process:
            path = save_checkpoint(self.output_dir / "checkpoints", state, keep_last=self.args.keep_last)
            # ``step`` counts budget units like the other events; the folder is named by optimizer steps
            self.events.emit("checkpoint", step=self.completed_units, optimizer_step=state.step, path=str(path))
        self.accelerator.wait_for_everyone()
        self._saved_progress = self.progress

    def _resume(self) -> str | None:
        path = latest_checkpoint(self.output_dir / "checkpoints")
        if path is None:
            return None
        state = load_checkpoint(path, verified=True)
        layout = self.parallel
        if any(not isinstance(key, str) for key in state.optimizer["state"]):
            raise FlowpostError(
                f"checkpoint {path} keys its optimizer state by position, as flowpost did before it keyed it by "
                "parameter name; start the stage over with --no-resume",
                where=str(path),
            )
        layout.load_model_state(self.model, state.model)
        layout.load_optimizer_state(self.model, self.optimizer.optimizer, state.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        for name, tensors in state.snapshots.items():
            self.adapter.snapshots.load_state_dict(name, layout.snapshot_from_state(tensors, self.model))
        torch.set_rng_state(state.rng["torch"])
        self.progress = TrainingProgress.from_dict(state.trainer["progress"])
        self.callbacks.load_state_dict(state.trainer.get("callbacks", {}))
        self._saved_progress = self.progress
        log.info("resumed stage %s from %s (step %d)", self.stage, path, state.step)
        saved_world, saved_layout = int(state.trainer["world_size"]), str(state.trainer["layout"])
        if (saved_world, saved_layout) != (self.accelerator.num_processes, layout.name):
            self._resumed_with = {"resumed_with_ranks_from": saved_world, "resumed_with_layout_from": saved_layout}
            log.warning(
                "stage %s was checkpointed with %d %s process(es) and resumes with %d %s: the run continues with "
                "the same global batches, but its numbers are no longer bit-identical to an uninterrupted run",
                self.stage,
                saved_world,
                saved_layout,
                self.accelerator.num_processes,
                layout.name,
            )
        return str(path)

    def save_final_weights(self) -> None:
        """``final/live`` always, ``final/<snapshot>`` for every snapshot (e.g. ``ema``), progress."""
        for name in [None, *self.adapter.snapshots.names()]:
            with self.parallel.whole_weights(self.adapter, name) as whole:
                if whole is not None:
                    with atomic_directory(self.output_dir / "final" / (name or "live")) as tmp:
                        whole.save_pretrained(tmp)
        if self.accelerator.is_main_process:
            write_json_atomic(self.output_dir / "final" / "progress.json", self.progress.to_dict())
