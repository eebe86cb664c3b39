"""Lifecycle callbacks: the loop calls them; they never drive it.

Callbacks see the trainer through ``TrainerView``, the part of it they may read, so they import
nothing from the trainers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from flowpost.core.models.base import ModelAdapter
    from flowpost.core.progress import TrainingProgress


class TrainerView(Protocol):
    """What a callback reads of the trainer that calls it."""

    stage: str
    progress: TrainingProgress
    adapter: ModelAdapter
    accelerator: Any
    parallel: Any
    model: nn.Module
    args: Any
    cost: dict[str, Any] | None  # the cost ledger's summary, once the stage has ended

    @property
    def budget(self) -> int: ...

    @property
    def completed_units(self) -> int: ...


class Callback:
    """Override any subset of the hooks. Every hook receives the trainer."""

    def on_train_start(self, trainer: TrainerView) -> None: ...
    def on_train_end(self, trainer: TrainerView) -> None: ...
    def on_before_optimizer_step(self, trainer: TrainerView) -> dict[str, float] | None: ...
    def on_step_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None: ...
    def on_validation_begin(self, trainer: TrainerView) -> None: ...
    def on_validation_end(self, trainer: TrainerView, results: dict[str, Any]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state saved with a checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CallbackList:
    """Dispatches every hook to each callback in order; state is keyed by each one's configured name."""

    def __init__(self, callbacks: dict[str, Callback]) -> None:
        self.callbacks = dict(callbacks)

    def on_train_start(self, trainer: TrainerView) -> None:
        for cb in self.callbacks.values():
            cb.on_train_start(trainer)

    def on_train_end(self, trainer: TrainerView) -> None:
        for cb in self.callbacks.values():
            cb.on_train_end(trainer)

    def on_before_optimizer_step(self, trainer: TrainerView) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for cb in self.callbacks.values():
            metrics.update(cb.on_before_optimizer_step(trainer) or {})
        return metrics

    def on_step_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        for cb in self.callbacks.values():
            cb.on_step_end(trainer, metrics)

    def on_validation_begin(self, trainer: TrainerView) -> None:
        for cb in self.callbacks.values():
            cb.on_validation_begin(trainer)

    def on_validation_end(self, trainer: TrainerView, results: dict[str, Any]) -> None:
        for cb in self.callbacks.values():
            cb.on_validation_end(trainer, results)

    def state_dict(self) -> dict[str, Any]:
        return {name: cb.state_dict() for name, cb in self.callbacks.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, cb in self.callbacks.items():
            cb.load_state_dict(state.get(name, {}))
