"""Where a stage's frozen networks live between the phases of its loop (``stages.NAME.offload``).

A frozen network (the VAE, the reward models) is held in host memory outside the phases that run it: when the
loop enters a phase (rollout, reward, optimize, evaluation, ...) ``Residency`` moves each offloaded network the
phase runs onto the compute device and every other one back to the host. Its host copy is made once, in
page-locked memory when the device is CUDA, so the move back is only the release of the device copy and the move
onto the device is one asynchronous copy per tensor (``non_blocking``), queued before the phase's first kernel.
A network used outside its phases is still correct: its own code moves it (``vae_on``, a reward's ``to``), and
the next phase boundary moves it back. On the CPU the device is the host: nothing is copied or moved.

Offloaded snapshots (reference, EMA, teacher, ...) are held by ``roles.Snapshots`` in host memory all the time
(``keep_on_host``; ``host_tensor`` makes their copies) and moved, one tensor at a time, into the network's weights
when swapped in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FunctionType, MethodType, ModuleType

import torch
from torch import Tensor, nn


def pinned(device: torch.device) -> bool:
    """Whether host copies for ``device`` are page-locked: only a CUDA device copies from them asynchronously."""
    return device.type == "cuda"


def host_tensor(value: Tensor, *, pin: bool, dtype: torch.dtype | None = None) -> Tensor:
    """A new copy of ``value`` in host memory (page-locked when ``pin``; in ``dtype`` when given). A copy from a
    device is asynchronous when ``pin``: synchronise (``settle``) before the host reads it."""
    host = torch.empty(value.shape, dtype=dtype or value.dtype, pin_memory=pin)
    host.copy_(value.detach(), non_blocking=pin)
    return host


def settle(device: torch.device) -> None:
    """Wait for the asynchronous copies queued on ``device`` (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attribute_networks(root: object, *, depth: int = 8) -> list[nn.Module]:
    """The torch modules ``root`` holds: in its attributes, in the lists, tuples and dicts among them and in the
    objects they hold (a reward wrapping another, a judge holding a scorer), up to ``depth`` levels down."""
    found: list[nn.Module] = []
    seen: set[int] = set()

    def visit(value: object, level: int) -> None:
        if level > depth or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, nn.Module):
            found.append(value)
            return
        if isinstance(value, list | tuple):
            items: Iterable[object] = value
        elif isinstance(value, dict):
            items = value.values()
        elif hasattr(value, "__dict__") and not isinstance(value, type | ModuleType | FunctionType | MethodType):
            items = vars(value).values()
        else:
            return
        for item in items:
            visit(item, level + 1)

    visit(root, 0)
    return found


@dataclass
class HeldNetworks:
    """Frozen networks offloaded together (``networks()`` lists the ones loaded so far) and the phases that run them.

    Each tensor that sits on an accelerator when first offloaded gets a host copy, kept for the stage (the
    networks are frozen: the copy stays valid) and keyed by its module and name; tensors already in host memory
    (a reward scoring on the CPU) are left where they are.
    """

    networks: Callable[[], list[nn.Module]]
    phases: frozenset[str]
    _host: dict[tuple[int, str], tuple[Tensor, torch.device]] = field(default_factory=dict, init=False)

    def _slots(self) -> Iterator[tuple[nn.Module, str, Tensor]]:
        """(owning module, name, tensor) of every parameter and buffer of the networks."""
        seen: set[int] = set()
        for network in self.networks():
            for module in network.modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                    yield module, name, tensor

    def to_host(self, pin: bool) -> bool:
        """Release the device copies; the tensors point at their host copies. Whether a copy was made (the first
        time a tensor is offloaded), which must land before the device memory it came from is reused."""
        copied = False
        for module, name, tensor in self._slots():
            if tensor.device.type in ("cpu", "meta"):
                continue
            key = (id(module), name)
            if key not in self._host:
                self._host[key] = (host_tensor(tensor, pin=pin), tensor.device)
                copied = True
            _point(module, name, self._host[key][0])
        return copied

    def to_device(self) -> None:
        """Copy each offloaded tensor back to the device it was offloaded from (asynchronously from pinned memory)."""
        for module, name, tensor in self._slots():
            held = self._host.get((id(module), name))
            if held is not None and tensor.device.type == "cpu":
                host, device = held
                _point(module, name, host.to(device, non_blocking=host.is_pinned()))

    def host_bytes(self) -> int:
        """Bytes of the host copies made so far."""
        return sum(host.numel() * host.element_size() for host, _ in self._host.values())


def _point(module: nn.Module, name: str, value: Tensor) -> None:
    """Make ``module``'s parameter or buffer ``name`` hold ``value`` (the Parameter object stays the same)."""
    current = getattr(module, name)
    if isinstance(current, nn.Parameter):
        current.data = value
    else:  # a registered buffer: assigning replaces it in the module's buffers
        setattr(module, name, value)


class Residency:
    """The offloaded frozen networks of a stage, placed at each phase boundary of the loop (``phase``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.units: dict[str, HeldNetworks] = {}
        self._phases: list[str] = []  # the open phases, innermost last
        self.resident: set[str] = set()  # the units the current phase runs (on the device unless it is the CPU)

    def add(self, name: str, networks: Callable[[], list[nn.Module]], phases: Iterable[str]) -> None:
        """Offload ``networks`` (called at each boundary: the networks loaded by then) outside ``phases``."""
        self.units[name] = HeldNetworks(networks, frozenset(phases))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run the block as phase ``name``: its networks on the device, the others on the host; the enclosing
        phase's placement comes back after it."""
        self._enter(name)
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()
            if self._phases:
                self._enter(self._phases[-1])

    def _enter(self, phase: str) -> None:
        copied = False
        for name, unit in self.units.items():
            if phase in unit.phases:
                unit.to_device()
                self.resident.add(name)
            else:
                copied |= unit.to_host(pinned(self.device))
                self.resident.discard(name)
        if copied:  # only the first offload of a tensor copies; later boundaries add no device sync
            settle(self.device)

    def host_bytes(self) -> dict[str, int]:
        """Bytes of host copies per offloaded unit."""
        return {name: unit.host_bytes() for name, unit in self.units.items()}
