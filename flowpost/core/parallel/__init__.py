"""How ranks hold the model: whole on every rank (``ddp``), sharded (``fsdp2``) or with gradients and
optimizer state partitioned (``deepspeed-zero2``, DeepSpeed ZeRO-2). A layout's ``name`` is the
``launch.backend`` that selects it; checkpoints, trainer state and events record it.

The trainer asks its layout for everything that differs between them: preparing the module and
optimizer, backward and synchronising gradients, clipping, checking the ranks agree, and moving whole
weights in and out for checkpoints and the final folders. Checkpoints always hold whole tensors, the
optimizer state keyed by parameter name, so a stage resumes under any world size and any layout.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn

from flowpost.core.models.base import ModelAdapter
from flowpost.core.parallel.fsdp import Sharded
from flowpost.core.parallel.replicated import Replicated
from flowpost.core.parallel.zero import ZeroPartitioned


class ParallelLayout(Protocol):
    """What a trainer asks of the way its ranks hold the model."""

    name: str
    collective_passes: bool  # True: every rank must run every forward and backward

    def prepare(self, adapter: ModelAdapter, device: torch.device) -> nn.Module:
        """The adapter's network on ``device``, laid out over the ranks."""
        ...

    def prepare_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, accelerator: Any) -> Any:
        """What the trainer steps and zeroes (``.optimizer`` is ``optimizer``)."""
        ...

    def backward(self, loss: torch.Tensor, accelerator: Any) -> None: ...

    def clip_gradients(self, accelerator: Any, model: nn.Module, max_norm: float) -> float | None:
        """Clip the global gradient norm to ``max_norm``; the norm before clipping, if known now."""
        ...

    def step_metrics(self) -> dict[str, float]:
        """Metrics only known after the optimizer step."""
        ...

    def sync_gradients(self, parameters: list[nn.Parameter]) -> float | None:
        """Average the gradients over ranks; the seconds it took (None when there was nothing to do)."""
        ...

    def ranks_agree(self, model: nn.Module) -> bool: ...

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole weights (collective where the model is sharded)."""
        ...

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The whole optimizer state keyed by parameter name (every layout's checkpoint format)."""
        ...

    def snapshot_state(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A snapshot's tensors as whole tensors."""
        ...

    def load_model_state(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None: ...

    def load_optimizer_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None: ...

    def snapshot_from_state(self, tensors: dict[str, torch.Tensor], network: nn.Module) -> dict[str, torch.Tensor]:
        """Whole snapshot tensors laid out like the parameters of ``network``, the one the snapshot was
        captured from (``adapter.module()``: with roles, the first role's network, not the bundle)."""
        ...

    def whole_weights(self, adapter: ModelAdapter, snapshot: str | None) -> AbstractContextManager[ModelAdapter | None]:
        """The adapter with the live weights or snapshot ``snapshot`` in place, on rank 0 (None elsewhere)."""
        ...


RECORDED_NAMES = {"replicated": "ddp", "sharded": "fsdp2", "zero2": "deepspeed-zero2"}  # older checkpoints' names


def recorded_layout(name: str) -> str:
    """The layout a checkpoint recorded as ``name``, under the name it has now (``RECORDED_NAMES``)."""
    return RECORDED_NAMES.get(name, name)


def parallel_layout(backend: str, world_size: int) -> ParallelLayout:
    """Over several processes: ``Sharded`` (fsdp2), ``ZeroPartitioned`` (deepspeed-zero2); else ``Replicated``
    (ddp, also for one process of any backend)."""
    if world_size > 1 and backend == "fsdp2":
        return Sharded()
    if world_size > 1 and backend == "deepspeed-zero2":
        return ZeroPartitioned()
    return Replicated()
