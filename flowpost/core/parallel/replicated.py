"""Every rank holds the whole model (layout ``ddp``): DDP arithmetic, one flat all-reduce per step."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from flowpost.core.distributed import average_gradients, broadcast_module, is_distributed, replicas_agree
from flowpost.core.models.base import ModelAdapter


class SteppedOptimizer:
    """A torch optimizer as the trainer steps and zeroes it; ``.optimizer`` is the optimizer itself.

    Not accelerate's wrapper: flowpost accumulates, averages and checks gradients itself and refuses
    fp16 loss scaling, so the wrapper would only add its per-step checks.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


class Replicated:
    """Every rank holds the whole model; one flat all-reduce averages the gradients per step."""

    name = "ddp"
    collective_passes = False  # True: every rank must run every forward and backward

    def prepare(self, adapter: ModelAdapter, device: torch.device) -> nn.Module:
        model = adapter.trainable_network().to(device)
        broadcast_module(model)  # replicas start equal whatever each rank's init did
        return model

    def prepare_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, accelerator: Any) -> Any:
        """What the trainer steps and zeroes (``.optimizer`` is ``optimizer``)."""
        return SteppedOptimizer(optimizer)

    def backward(self, loss: torch.Tensor, accelerator: Any) -> None:
        accelerator.backward(loss)

    def clip_gradients(self, accelerator: Any, model: nn.Module, max_norm: float) -> float | None:
        """Clip the global gradient norm to ``max_norm``; the norm before clipping."""
        return float(accelerator.clip_grad_norm_(model.parameters(), max_norm))

    def step_metrics(self) -> dict[str, float]:
        """Metrics only known after the optimizer step."""
        return {}

    def sync_gradients(self, parameters: list[nn.Parameter]) -> float | None:
        """Average the gradients over ranks; the seconds it took (None in a single process)."""
        if not is_distributed():
            return None
        started = time.perf_counter()
        average_gradients(parameters)
        return time.perf_counter() - started

    def ranks_agree(self, model: nn.Module) -> bool:
        return replicas_agree(model)

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return model.state_dict()

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The whole optimizer state keyed by parameter name (every layout's checkpoint format)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)

    def snapshot_state(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return tensors

    def load_model_state(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        model.load_state_dict(state)

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def snapshot_from_state(self, tensors: dict[str, torch.Tensor], network: nn.Module) -> dict[str, torch.Tensor]:
        return tensors

    @contextmanager
    def whole_weights(self, adapter: ModelAdapter, snapshot: str | None) -> Iterator[ModelAdapter | None]:
        """The adapter with the live weights or snapshot ``snapshot`` in place, on rank 0 (None elsewhere)."""
        if dist.is_initialized() and dist.get_rank() != 0:
            yield None
        elif snapshot is None:
            yield adapter
        else:
            with adapter.use_snapshot(snapshot):
                yield adapter
