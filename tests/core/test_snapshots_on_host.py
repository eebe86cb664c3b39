"""Snapshots kept on the host: moved there when already held, swapped in and EMA-updated exactly as resident ones."""

from __future__ import annotations

import torch

from flowpost.core.roles import Snapshots

CPU = torch.device("cpu")


def _network(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def test_a_snapshot_kept_on_the_host_swaps_in_and_averages_as_a_resident_one() -> None:
    network, x = _network(0), torch.randn(2, 4)
    resident, hosted = Snapshots(), Snapshots()
    for snapshots in (resident, hosted):
        snapshots.capture("ema", network)
    before = hosted.state_dict("ema")
    hosted.keep_on_host(iter(["ema", "ref"]), CPU)  # one already held (moved to new copies), one not yet
    assert hosted.hosted() == ["ema", "ref"]
    after = hosted.state_dict("ema")
    assert all(after[k] is not before[k] and torch.equal(after[k], before[k]) for k in before)
    with torch.no_grad():
        for param in network.parameters():
            param.add_(1.0)
    for snapshots in (resident, hosted):
        snapshots.ema_update("ema", network, 0.9)
    assert all(torch.equal(resident.state_dict("ema")[k], hosted.state_dict("ema")[k]) for k in before)
    live = network(x)
    with resident.swapped_in("ema", network):
        expected = network(x)
    with hosted.swapped_in("ema", network):
        assert torch.equal(network(x), expected)
    assert torch.equal(network(x), live)
    hosted.capture("ref", network)
    assert all(t.device == CPU and t.dtype == torch.float32 for t in hosted.state_dict("ref").values())
