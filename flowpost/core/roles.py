"""Named weight snapshots (reference, EMA, old policy): frozen copies, never trainable modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class Snapshots:
    """Holds named fp32 copies of a module's trainable parameters and swaps them in on demand."""

    def __init__(self) -> None:
        self._store: dict[str, dict[str, torch.Tensor]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._store

    def names(self) -> list[str]:
        return sorted(self._store)

    @torch.no_grad()
    def capture(self, name: str, module: nn.Module) -> None:
        """Store the current trainable parameters of ``module`` under ``name``."""
        _resharded(module)
        self._store[name] = {
            key: param.detach().to(torch.float32).clone()
            for key, param in module.named_parameters()
            if param.requires_grad
        }

    @torch.no_grad()
    def ema_update(self, name: str, module: nn.Module, decay: float) -> None:
        """snapshot <- decay * snapshot + (1 - decay) * live, creating it on first use."""
        if name not in self._store:
            self.capture(name, module)
            return
        snapshot = self._store[name]
        _resharded(module)
        for key, param in module.named_parameters():
            if key in snapshot:
                value = self._on_device(snapshot, key, param.device)
                value.lerp_(param.detach().to(torch.float32), 1.0 - decay)

    @staticmethod
    def _on_device(snapshot: dict[str, torch.Tensor], key: str, device: torch.device) -> torch.Tensor:
        """``snapshot[key]`` on ``device``, moved there (and stored back) the first time it differs."""
        value = snapshot[key]
        if value.device != device:
            value = snapshot[key] = value.to(device)
        return value

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        return self._store[name]

    def load_state_dict(self, name: str, state: dict[str, torch.Tensor]) -> None:
        self._store[name] = {key: value.to(torch.float32).clone() for key, value in state.items()}

    @contextlib.contextmanager
    def swapped_in(self, name: str, module: nn.Module) -> Iterator[nn.Module]:
        """Temporarily load snapshot ``name`` into ``module``; the live weights come back after."""
        snapshot = self._store[name]
        params = dict(_resharded(module).named_parameters())
        live = {key: params[key].detach().clone() for key in snapshot}
        with torch.no_grad():
            for key in snapshot:
                params[key].copy_(self._on_device(snapshot, key, params[key].device))
        try:
            yield module
        finally:
            _resharded(module)  # drop weights gathered under the snapshot
            with torch.no_grad():
                for key, value in live.items():
                    params[key].copy_(value)


def _resharded(module: nn.Module) -> nn.Module:
    """An FSDP2 root may keep its parameters gathered after a forward; shard them back (no-op otherwise)."""
    reshard = getattr(module, "reshard", None)
    if callable(reshard):
        reshard()
    return module
