"""A torch function mode that fails on any call mixing tensors of several devices."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


class OneDevice(TorchFunctionMode):
    """Raises when a torch call gets tensors of more than one device (a move with ``.to`` is one tensor)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        devices = {leaf.device for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, Tensor)}
        if len(devices) > 1:
            raise AssertionError(f"{getattr(func, '__name__', func)} mixes tensors on {sorted(map(str, devices))}")
        return func(*args, **kwargs)


def rollout_on(trainer: Any, rollout: Any, device: torch.device) -> Any:
    """Move ``trainer``'s trainable network and its updates to ``device``; ``rollout`` with its tensors there."""
    trainer.adapter.trainable_network().to(device)
    trainer.accelerator = SimpleNamespace(device=device)  # where the updates run; the network is already there
    return replace(
        rollout,
        conditions=rollout.conditions.to(device),
        final=rollout.final.to(device),
        latents=rollout.latents.to(device),
        next_latents=rollout.next_latents.to(device),
    )
