"""Lifecycle callbacks: the loop calls them; they never drive it."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

TrainerT = TypeVar("TrainerT")


class Callback(Generic[TrainerT]):
    """Override any subset of the hooks. Every hook receives the trainer, of the type a subclass names."""

    def on_train_start(self, trainer: TrainerT) -> None: ...
    def on_train_end(self, trainer: TrainerT) -> None: ...
    def on_before_optimizer_step(self, trainer: TrainerT) -> dict[str, float] | None: ...
    def on_step_end(self, trainer: TrainerT, metrics: dict[str, float]) -> None: ...
    def on_validation_begin(self, trainer: TrainerT) -> None: ...
    def on_validation_end(self, trainer: TrainerT, results: dict[str, Any]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state saved with a checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CallbackList(Callback[TrainerT]):
    """Dispatches every hook to each callback in order."""

    def __init__(self, callbacks: list[Callback[TrainerT]]) -> None:
        self.callbacks = list(callbacks)

    def on_train_start(self, trainer: TrainerT) -> None:
        for cb in self.callbacks:
            cb.on_train_start(trainer)

    def on_train_end(self, trainer: TrainerT) -> None:
        for cb in self.callbacks:
            cb.on_train_end(trainer)

    def on_before_optimizer_step(self, trainer: TrainerT) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for cb in self.callbacks:
            metrics.update(cb.on_before_optimizer_step(trainer) or {})
        return metrics

    def on_step_end(self, trainer: TrainerT, metrics: dict[str, float]) -> None:
        for cb in self.callbacks:
            cb.on_step_end(trainer, metrics)

    def on_validation_begin(self, trainer: TrainerT) -> None:
        for cb in self.callbacks:
            cb.on_validation_begin(trainer)

    def on_validation_end(self, trainer: TrainerT, results: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_validation_end(trainer, results)

    def state_dict(self) -> dict[str, Any]:
        return {type(cb).__name__: cb.state_dict() for cb in self.callbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.load_state_dict(state.get(type(cb).__name__, {}))
