"""FSDP2 (layout ``fsdp2``): each rank holds a shard of every block; backward reduce-scatters the gradients."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from flowpost.core.models.base import ModelAdapter
from flowpost.core.parallel.replicated import Replicated


class Sharded(Replicated):
    """FSDP2: ``fully_shard`` per block, then the root; gradients are reduce-scattered in backward.

    ``fully_shard`` works in place (class, parameter names and direct calls stay), so snapshots,
    EMA and adapters run unchanged on the DTensor shards. Rank 0 keeps a whole CPU copy of the
    adapter only to write final folders.
    """

    name = "fsdp2"
    collective_passes = True

    def prepare(self, adapter: ModelAdapter, device: torch.device) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.tensor import init_device_mesh

        self._whole = copy.deepcopy(adapter) if dist.get_rank() == 0 else None  # before it moves to the device
        if self._whole is not None:
            self._whole.module().to("cpu")
        model = super().prepare(adapter, device)
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        # fp32 shards (the trainer upcast what it trains), gathered in the compute dtype, gradients reduced in fp32
        policy = MixedPrecisionPolicy(param_dtype=adapter.compute_dtype, reduce_dtype=torch.float32)
        for unit in adapter.shard_units():
            fully_shard(unit, mesh=mesh, mp_policy=policy)
        for root in adapter.role_networks():  # each role's network runs its own forwards: one root each
            fully_shard(root, mesh=mesh, mp_policy=policy)
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

    def snapshot_from_state(self, tensors: dict[str, torch.Tensor], network: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = dict(network.named_parameters())
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
