"""Snapshots follow the parameters' device; the EMA callback keys snapshots by the bare network."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from flowpost.core.callbacks.ema import EMACallback
from flowpost.core.roles import Snapshots
from flowpost.core.snapshots import Snapshot


def _cpu_state(module: nn.Module, fill: float) -> dict[str, torch.Tensor]:
    return {key: torch.full(param.shape, fill) for key, param in module.named_parameters()}


def test_loaded_snapshot_moves_to_the_parameter_device_once_for_ema_updates() -> None:
    module = nn.Linear(2, 2, device="meta")  # a device other than the CPU the state was loaded on
    snapshots = Snapshots()
    snapshots.load_state_dict("ema", _cpu_state(module, 1.0))
    snapshots.ema_update("ema", module, 0.9)
    stored = snapshots.state_dict("ema")
    assert {value.device.type for value in stored.values()} == {"meta"}
    before = {key: id(value) for key, value in stored.items()}
    snapshots.ema_update("ema", module, 0.9)
    assert {key: id(value) for key, value in snapshots.state_dict("ema").items()} == before


def test_loaded_snapshot_swaps_into_a_module_on_another_device() -> None:
    module = nn.Linear(2, 2, device="meta")
    snapshots = Snapshots()
    snapshots.load_state_dict("ref", _cpu_state(module, 2.0))
    with snapshots.swapped_in("ref", module):
        pass
    assert {value.device.type for value in snapshots.state_dict("ref").values()} == {"meta"}


def test_swapped_in_loads_the_snapshot_and_restores_live_weights() -> None:
    module = nn.Linear(2, 2)
    live = {key: value.clone() for key, value in module.state_dict().items()}
    snapshots = Snapshots()
    snapshots.load_state_dict("ref", _cpu_state(module, 2.0))
    with snapshots.swapped_in("ref", module):
        assert all(bool((p == 2.0).all()) for p in module.parameters())
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, live[key])


class _Wrapper(nn.Module):
    """Stands in for DistributedDataParallel: parameters are named ``module.*``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_ema_callback_keys_the_snapshot_by_the_adapter_network_not_the_wrapper() -> None:
    net = nn.Linear(2, 2)
    adapter = SimpleNamespace(snapshots=Snapshots(), module=lambda: net)
    trainer = SimpleNamespace(adapter=adapter, model=_Wrapper(net), progress=SimpleNamespace(optimizer_step=1))
    callback = EMACallback(decay=0.5, schedule="constant")
    callback.on_train_start(trainer)  # type: ignore[arg-type]
    with torch.no_grad():
        net.weight.add_(1.0)
    callback.on_step_end(trainer, {})  # type: ignore[arg-type]
    ema = adapter.snapshots.state_dict(Snapshot.EMA)
    assert set(ema) == {"weight", "bias"}
    torch.testing.assert_close(ema["weight"], net.weight.detach() - 0.5)
    with adapter.snapshots.swapped_in(Snapshot.EMA, net):
        torch.testing.assert_close(net.weight.detach(), ema["weight"])
