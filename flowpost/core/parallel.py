"""How ranks hold the model: whole on every rank (``replicated``, DDP arithmetic) or ``sharded`` (FSDP2).

DeepSpeed ZeRO-2 (``flowpost.core.parallel_zero``) is a third layout. The trainer asks its layout
for everything that differs between them: preparing the module and optimizer, backward and
synchronising gradients, clipping, checking the ranks agree, and moving whole weights in and out for
checkpoints and the final folders. Checkpoints always hold whole tensors, the optimizer state keyed
by parameter name, so a stage resumes under any world size and any layout.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from flowpost.core.distributed import average_gradients, broadcast_module, is_distributed, replicas_agree
from flowpost.core.models.base import ModelAdapter


class Replicated:
    """Every rank holds the whole model; one flat all-reduce averages the gradients per step."""

    name = "replicated"
    collective_passes = False  # True: every rank must run every forward and backward

    def prepare(self, adapter: ModelAdapter, device: torch.device) -> nn.Module:
        model = adapter.module().to(device)
        broadcast_module(model)  # replicas start equal whatever each rank's init did
        return model

    def prepare_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, accelerator: Any) -> Any:
        """What the trainer steps and zeroes (``.optimizer`` is ``optimizer``)."""
        return accelerator.prepare_optimizer(optimizer)

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

    def snapshot_from_state(self, tensors: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
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


class Sharded(Replicated):
    """FSDP2: ``fully_shard`` per block, then the root; gradients are reduce-scattered in backward.

    ``fully_shard`` works in place (class, parameter names and direct calls stay), so snapshots,
    EMA and adapters run unchanged on the DTensor shards. Rank 0 keeps a whole CPU copy of the
    adapter only to write final folders.
    """

    name = "sharded"
    collective_passes = True

    def prepare(self, adapter: ModelAdapter, device: torch.device) -> nn.Module:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import init_device_mesh

        self._whole = copy.deepcopy(adapter) if dist.get_rank() == 0 else None  # before it moves to the device
        if self._whole is not None:
            self._whole.module().to("cpu")
        model = super().prepare(adapter, device)
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for unit in adapter.shard_units():
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def sync_gradients(self, parameters: list[nn.Parameter]) -> float | None:
        """Nothing to do: backward already reduce-scattered the averaged gradients."""
        return None

    def ranks_agree(self, model: nn.Module) -> bool:
        return True  # each rank holds a different shard by design

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def snapshot_state(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from torch.distributed.tensor import DTensor

        return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in tensors.items()}

    def load_model_state(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def snapshot_from_state(self, tensors: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = dict(model.named_parameters())
        return {
            key: distribute_tensor(value.to(params[key].device), params[key].device_mesh, params[key].placements)
            if isinstance(params[key], DTensor)
            else value
            for key, value in tensors.items()
        }

    @contextmanager
    def whole_weights(self, adapter: ModelAdapter, snapshot: str | None) -> Iterator[ModelAdapter | None]:
        live = self.model_state(adapter.module())  # collective: every rank takes part
        chosen = self.snapshot_state(adapter.snapshots.state_dict(snapshot)) if snapshot else {}
        if self._whole is None:
            yield None
            return
        self._whole.module().load_state_dict({**live, **chosen})
        yield self._whole


def parallel_layout(backend: str, world_size: int) -> Replicated:
    """Over several processes: ``Sharded`` (fsdp2), ``ZeroPartitioned`` (deepspeed-zero2); else ``Replicated``."""
    if world_size > 1 and backend == "fsdp2":
        return Sharded()
    if world_size > 1 and backend == "deepspeed-zero2":
        from flowpost.core.parallel_zero import ZeroPartitioned

        return ZeroPartitioned()
    return Replicated()
