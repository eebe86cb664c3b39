"""A trainer's checkpoints: save, resume from the latest intact one, and write the final weights.

Every rank builds the training state (gathering sharded weights is collective); rank 0 writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flowpost.core.checkpoint import (
    TrainingState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from flowpost.core.events import CheckpointEvent
from flowpost.core.io import atomic_directory, file_errors_reported, write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.core.models.quantize import with_quantized, without_quantized
from flowpost.core.parallel import recorded_layout
from flowpost.core.progress import TrainingProgress
from flowpost.core.trainers.eight_bit import plain_state, quantized_state
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.callbacks.base import CallbackList
    from flowpost.core.evaluation.guard import StageGuard
    from flowpost.core.events import EventLog
    from flowpost.core.ledger import CostLedger
    from flowpost.core.models.base import ModelAdapter
    from flowpost.core.parallel import ParallelLayout
    from flowpost.core.trainers.optimizers import RoleOptimizer

log = get_logger(__name__)


@dataclass(frozen=True)
class Resumed:
    """What a resume restored: the checkpoint, its progress, and the world it was written by."""

    path: Path
    progress: TrainingProgress
    world_size: int
    layout: str


@dataclass
class CheckpointManager:
    """``save`` / ``resume`` / ``save_final`` of one stage's model, optimizer, snapshots and counters.

    8-bit optimizer moments are written as plain tensors (``eight_bit.plain_state``).
    ``roles`` are the trainable roles after the first (whose optimizer is ``optimizer``): each one's
    optimizer, schedule and update counter go into the checkpoint too; so do the ``guard``'s checks, and
    the checkpoint of its last passed check is never pruned.
    """

    output_dir: Path
    accelerator: Any
    adapter: ModelAdapter
    parallel: ParallelLayout
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    callbacks: CallbackList
    events: EventLog
    keep_last: int | None = None
    roles: dict[str, RoleOptimizer] = field(default_factory=dict)
    guard: StageGuard | None = None
    ledger: CostLedger | None = None
    saved: TrainingProgress | None = None

    def save(self, progress: TrainingProgress, *, position: dict[str, int | None]) -> None:
        """Checkpoint ``progress``; ``position`` (its step, and iteration for an online trainer) goes into the
        event."""
        layout, snapshots = self.parallel, self.adapter.snapshots
        state = TrainingState(  # every rank builds it: gathering sharded weights is collective
            step=progress.optimizer_step,
            model=without_quantized(layout.model_state(self.model)),  # re-created from the base on resume
            optimizer=plain_state(layout.optimizer_state(self.model, self.optimizer.optimizer)),
            scheduler=self.scheduler.state_dict(),
            snapshots={n: layout.snapshot_state(snapshots.state_dict(n)) for n in snapshots.names()},
            rng={"torch": torch.get_rng_state()},
            trainer={
                "progress": progress.to_dict(),
                "callbacks": self.callbacks.state_dict(),
                "world_size": self.accelerator.num_processes,
                "layout": layout.name,
                "role_updates": {role: optimizer.updates for role, optimizer in self.roles.items()},
                **({"guard": self.guard.state_dict()} if self.guard is not None else {}),
                **({"ledger": self.ledger.state_dict()} if self.ledger is not None else {}),
            },
            roles={
                role: {
                    "optimizer": plain_state(layout.optimizer_state(self.model, optimizer.optimizer)),
                    "scheduler": optimizer.scheduler.state_dict(),
                }
                for role, optimizer in self.roles.items()
            },
        )
        if self.accelerator.is_main_process:
            good = self.guard.last_good if self.guard is not None else None
            kept = (self.path(good.step),) if good is not None else ()
            path = save_checkpoint(self.output_dir / "checkpoints", state, keep_last=self.keep_last, also_keep=kept)
            self.events.write(CheckpointEvent(stage=self.events.stage, **position, path=str(path)))
        self.accelerator.wait_for_everyone()
        self.saved = progress

    def path(self, optimizer_step: int) -> Path:
        """The folder of the checkpoint at ``optimizer_step``."""
        return self.output_dir / "checkpoints" / f"step-{optimizer_step}"

    def resume(self) -> Resumed | None:
        """Load the latest intact checkpoint into the model, optimizer, snapshots, callbacks and guard."""
        path = latest_checkpoint(self.output_dir / "checkpoints")
        if path is None:
            return None
        resumed = self.load(path)
        log.info("resumed from %s (step %d)", path, resumed.progress.optimizer_step)
        return resumed

    def restore(self, optimizer_step: int) -> TrainingProgress:
        """Go back to the checkpoint at ``optimizer_step`` (the guard keeps its checks since); its progress."""
        path = self.path(optimizer_step)
        if (problem := verify_checkpoint(path)) is not None:
            raise FlowpostError(f"cannot go back to checkpoint {path}: {problem}", where=str(path))
        progress = self.load(path, resuming=False).progress
        log.info("went back to %s", path)
        return progress

    def load(self, path: Path, *, resuming: bool = True) -> Resumed:
        """Load checkpoint ``path`` into the model, optimizer, snapshots, callbacks and, ``resuming`` (not going
        back to it within the run), the guard and the cost ledger (the time spent since is spent)."""
        state = load_checkpoint(path, verified=True)
        layout = self.parallel
        if any(not isinstance(key, str) for key in state.optimizer["state"]):
            raise FlowpostError(
                f"checkpoint {path} keys its optimizer state by position, as flowpost did before it keyed it by "
                "parameter name; start the stage over with --no-resume",
                where=str(path),
            )
        layout.load_model_state(self.model, with_quantized(state.model, self.model))
        layout.load_optimizer_state(self.model, self.optimizer.optimizer, quantized_state(state.optimizer))
        self.scheduler.load_state_dict(state.scheduler)
        if sorted(state.roles) != sorted(self.roles):
            raise FlowpostError(
                f"checkpoint {path} holds the roles {sorted(state.roles) or 'none'} but the trainer trains "
                f"{sorted(self.roles) or 'none'} besides its first; start the stage over with --no-resume",
                where=str(path),
            )
        updates = state.trainer.get("role_updates", {})
        for role, optimizer in self.roles.items():
            saved = quantized_state(state.roles[role]["optimizer"])
            layout.load_optimizer_state(self.model, optimizer.optimizer, saved)
            optimizer.scheduler.load_state_dict(state.roles[role]["scheduler"])
            optimizer.updates = int(updates[role])
        network = self.adapter.module()  # what snapshots are keyed by: the first role's network, not the bundle
        for name, tensors in state.snapshots.items():
            _check_snapshot_names(path, name, tensors, network)
            self.adapter.snapshots.load_state_dict(name, layout.snapshot_from_state(tensors, network))
        torch.set_rng_state(state.rng["torch"])
        self.callbacks.load_state_dict(state.trainer.get("callbacks", {}))
        if resuming and self.guard is not None:
            self.guard.load_state_dict(state.trainer.get("guard", {}))
        if resuming and self.ledger is not None:
            self.ledger.load_state_dict(state.trainer.get("ledger", {}))
        resumed = Resumed(
            path=path,
            progress=TrainingProgress.from_dict(state.trainer["progress"]),
            world_size=int(state.trainer["world_size"]),
            layout=recorded_layout(str(state.trainer["layout"])),
        )
        self.saved = resumed.progress
        return resumed

    def save_final(self, progress: TrainingProgress) -> None:
        """``final/live`` always, ``final/<snapshot>`` for every snapshot (e.g. ``ema``), progress."""
        for name in [None, *self.adapter.snapshots.names()]:
            with self.parallel.whole_weights(self.adapter, name) as whole:
                if whole is not None:
                    folder = self.output_dir / "final" / (name or "live")
                    with (
                        file_errors_reported("writing the final weights", where=folder),
                        atomic_directory(folder) as tmp,
                    ):
                        whole.save_pretrained(tmp)
        if self.accelerator.is_main_process:
            path = self.output_dir / "final" / "progress.json"
            with file_errors_reported("writing the final weights", where=path):
                write_json_atomic(path, progress.to_dict())


def _check_snapshot_names(path: Path, name: str, tensors: dict[str, torch.Tensor], network: torch.nn.Module) -> None:
    """Snapshot ``name`` of checkpoint ``path`` names only parameters of ``network``."""
    unknown = sorted(set(tensors) - {key for key, _ in network.named_parameters()})
    if unknown:
        raise FlowpostError(
            f"checkpoint {path} holds snapshot {name!r} with {len(unknown)} parameter(s) the network lacks "
            f"(e.g. {unknown[0]!r}); start the stage over with --no-resume",
            where=str(path),
        )
