"""Replica helpers on a real 2-process gloo group."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from flowpost.core.distributed import average_gradients, broadcast_module, mean_over_ranks, replicas_agree


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(rank)  # replicas start different
        model = nn.Linear(3, 2)
        broadcast_module(model)
        same_after_broadcast = replicas_agree(model)
        model.weight.grad = torch.full_like(model.weight, float(rank + 1))  # rank 1 has no bias gradient
        if rank == 0:
            model.bias.grad = torch.full_like(model.bias, 4.0)
        average_gradients(model.parameters())
        metrics = mean_over_ranks({"loss": 1.0 + rank, **({"only_rank_1": 6.0} if rank else {})})
        with torch.no_grad():
            model.weight[0, 0] += rank * 1e-6
        results[rank] = {
            "same_after_broadcast": same_after_broadcast,
            "weight_grad": model.weight.grad.clone(),
            "bias_grad": model.bias.grad.clone(),
            "metrics": metrics,
            "same_after_drift": replicas_agree(model),
            "weight": model.weight.detach().clone(),
        }
    finally:
        dist.destroy_process_group()


def test_ddp_helpers_broadcast_average_gradients_and_detect_drift() -> None:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(_free_port(), results), nprocs=2)
        results = dict(results)
    for rank in (0, 1):
        result = results[rank]
        assert result["same_after_broadcast"]
        assert torch.equal(result["weight_grad"], torch.full((2, 3), 1.5))
        assert torch.equal(result["bias_grad"], torch.full((2,), 2.0))
        assert result["metrics"] == {"loss": 1.5, "only_rank_1": 3.0}
        assert not result["same_after_drift"]
    assert not torch.equal(results[0]["weight"], results[1]["weight"])
