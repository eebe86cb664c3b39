"""Live trainable copies of a network, one per role (component variants), and named weight snapshots
(teacher, reference, EMA, old policy): frozen copies, never trainable modules."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from flowpost.core.residency import host_tensor, pinned, settle
from flowpost.core.snapshots import SNAPSHOT_NAMES


class ComponentVariants:
    """One live trainable copy of a network per role; the first role owns the base network itself.

    Full fine-tuning routes each role to its own deep copy (taken when the variants are declared,
    so every role starts from the same weights); the copies sit in one ``bundle`` module, keyed by
    role. ``RoleAdapters`` (LoRA) instead puts one adapter per role on the shared base. Either way
    the parallel layout prepares the ``bundle`` as a whole, before any wrapping.
    """

    def __init__(self, base: nn.Module, roles: Sequence[str]) -> None:
        problems = role_problems(roles)
        if problems:
            raise ValueError("; ".join(problems))
        self.roles = tuple(roles)
        self.bundle: nn.Module = self._materialise(base)

    def _materialise(self, base: nn.Module) -> nn.Module:
        bundle = nn.ModuleDict({self.roles[0]: base})
        for role in self.roles[1:]:
            bundle[role] = copy.deepcopy(base)
        return bundle

    def __contains__(self, role: str) -> bool:
        return role in self.roles

    def _check(self, role: str) -> None:
        if role not in self.roles:
            where = "a frozen snapshot, not a trainable role" if role in SNAPSHOT_NAMES else "not a declared role"
            raise KeyError(f"{role!r} is {where}; the roles are: {', '.join(self.roles)}")

    def module(self, role: str) -> nn.Module:
        """The network that runs role ``role``."""
        self._check(role)
        assert isinstance(self.bundle, nn.ModuleDict)
        return self.bundle[role]

    def networks(self) -> list[nn.Module]:
        """The distinct networks the roles run on (each its own FSDP2 root)."""
        return [self.module(role) for role in self.roles]

    def named_parameters(self, role: str) -> list[tuple[str, nn.Parameter]]:
        """The parameters role ``role`` owns and trains (what its optimizer steps)."""
        return [(name, param) for name, param in self.module(role).named_parameters() if param.requires_grad]

    @contextlib.contextmanager
    def activated(self, role: str) -> Iterator[nn.Module]:
        """Make ``role`` the one that runs; yields its network."""
        yield self.module(role)


class RoleAdapters(ComponentVariants):
    """LoRA roles: one adapter per role on the shared, frozen base (the first role's is ``default``)."""

    DEFAULT = "default"

    def _materialise(self, base: nn.Module) -> nn.Module:
        config = base.peft_config[self.DEFAULT]  # type: ignore[index]
        for role in self.roles[1:]:
            base.add_adapter(copy.deepcopy(config), adapter_name=role)  # type: ignore[operator]
        self.bundle = base
        self._switch(self.DEFAULT)
        return base

    def _switch(self, adapter: str) -> None:
        """Run ``adapter`` alone; every role's adapter stays trainable (PEFT would freeze the inactive
        ones, and a gradient reaches only parameters that still require it when backward runs)."""
        self.bundle.set_adapter(adapter)  # type: ignore[operator]
        for role in self.roles:
            for _, param in self.named_parameters(role):
                param.requires_grad_(True)

    def _adapter(self, role: str) -> str:
        self._check(role)
        return self.DEFAULT if role == self.roles[0] else role

    def module(self, role: str) -> nn.Module:
        self._check(role)
        return self.bundle

    def networks(self) -> list[nn.Module]:
        return [self.bundle]

    def named_parameters(self, role: str) -> list[tuple[str, nn.Parameter]]:
        marker = f".{self._adapter(role)}."
        return [(name, param) for name, param in self.bundle.named_parameters() if marker in name]

    @contextlib.contextmanager
    def activated(self, role: str) -> Iterator[nn.Module]:
        self._switch(self._adapter(role))
        try:
            yield self.bundle
        finally:
            self._switch(self.DEFAULT)


def role_problems(roles: Sequence[str]) -> list[str]:
    """Why ``roles`` cannot be a trainer's ordered trainable roles (empty when they can)."""
    problems = []
    if not roles:
        problems.append("at least one trainable role is needed")
    duplicates = sorted({role for role in roles if list(roles).count(role) > 1})
    if duplicates:
        problems.append(f"role {', '.join(map(repr, duplicates))} is declared more than once")
    frozen = [role for role in roles if role in SNAPSHOT_NAMES]
    if frozen:
        problems.append(
            f"{', '.join(map(repr, frozen))} names frozen weights: a snapshot (Snapshots.capture), not a variant"
        )
    return problems


class Snapshots:
    """Holds named fp32 copies of a module's trainable parameters and swaps them in on demand.

    A snapshot kept on the host (``keep_on_host``: ``stages.NAME.offload``) is held in host memory (page-locked
    for a CUDA device) whenever it is captured, loaded or updated, and swapped in by copying it straight into
    the weights; any other one moves to the weights' device on its first use and stays there.
    """

    def __init__(self) -> None:
        self._store: dict[str, dict[str, torch.Tensor]] = {}
        self._hosted: dict[str, torch.device] = {}  # snapshots kept on the host -> the device they serve

    def __contains__(self, name: str) -> bool:
        return name in self._store

    def names(self) -> list[str]:
        return sorted(self._store)

    def hosted(self) -> list[str]:
        """The snapshot names kept on the host (captured or not yet)."""
        return sorted(self._hosted)

    def keep_on_host(self, names: Iterable[str], device: torch.device) -> None:
        """Hold snapshots ``names`` in host memory from now on, for weights on ``device`` (those held already move)."""
        names = list(names)
        held = [name for name in names if name in self._store]
        self._hosted.update(dict.fromkeys(names, device))
        for name in held:
            self._store[name] = self._stored(name, self._store[name])
        if held:
            settle(device)

    def _stored(self, name: str, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """New fp32 copies of ``values`` where snapshot ``name`` is held: the host, or where they are."""
        device = self._hosted.get(name)
        if device is None:
            return {key: value.detach().to(torch.float32).clone() for key, value in values.items()}
        return {key: host_tensor(value, pin=pinned(device), dtype=torch.float32) for key, value in values.items()}

    @torch.no_grad()
    def capture(self, name: str, module: nn.Module) -> None:
        """Store the current trainable parameters of ``module`` under ``name``."""
        _resharded(module)
        self._store[name] = self._stored(
            name, {key: param for key, param in module.named_parameters() if param.requires_grad}
        )

    @torch.no_grad()
    def ema_update(self, name: str, module: nn.Module, decay: float) -> None:
        """snapshot <- decay * snapshot + (1 - decay) * live, creating it on first use; a snapshot kept on the
        host is updated on the weights' device, one tensor at a time, and copied back."""
        if name not in self._store:
            self.capture(name, module)
            return
        snapshot, hosted = self._store[name], name in self._hosted
        _resharded(module)
        for key, param in module.named_parameters():
            if key not in snapshot:
                continue
            held = snapshot[key]
            value = held.to(param.device, non_blocking=True) if hosted else self._on_device(snapshot, key, param.device)
            value.lerp_(param.detach().to(torch.float32), 1.0 - decay)
            if value is not held and hosted:
                held.copy_(value, non_blocking=True)  # read on the host only after ``state_dict`` settles it

    @staticmethod
    def _on_device(snapshot: dict[str, torch.Tensor], key: str, device: torch.device) -> torch.Tensor:
        """``snapshot[key]`` on ``device``, moved there (and stored back) the first time it differs."""
        value = snapshot[key]
        if value.device != device:
            value = snapshot[key] = value.to(device)
        return value

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        if name in self._hosted:
            settle(self._hosted[name])  # the copies an EMA update queued have landed
        return self._store[name]

    def load_state_dict(self, name: str, state: dict[str, torch.Tensor]) -> None:
        self._store[name] = self._stored(name, state)

    @contextlib.contextmanager
    def swapped_in(self, name: str, module: nn.Module) -> Iterator[nn.Module]:
        """Temporarily load snapshot ``name`` into ``module``; the live weights come back after."""
        snapshot, hosted = self._store[name], name in self._hosted
        params = dict(_resharded(module).named_parameters())
        live = {key: params[key].detach().clone() for key in snapshot}
        with torch.no_grad():
            for key in snapshot:  # a hosted tensor moves on its own first, one at a time (asynchronously when pinned)
                device = params[key].device
                held = snapshot[key].to(device, non_blocking=True) if hosted else self._on_device(snapshot, key, device)
                params[key].copy_(held)
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
