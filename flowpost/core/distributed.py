"""Data-parallel replicas kept in lockstep: one broadcast at start, one gradient average per step.

Adapters call their transformer directly (snapshots swap weights in place, several forwards may
precede one backward), so replicas are not kept in sync by a wrapper's forward hooks. Instead every
optimizer step averages the gradients of all trainable parameters in one flat all-reduce (DDP's
arithmetic, without its bucketing), and ``replicas_agree`` checks at the end that no rank drifted.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def leave_process_group() -> None:
    """Wait for every rank, then close the process group, so no rank exits while a peer still talks to it."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def broadcast_module(module: nn.Module, *, src: int = 0) -> None:
    """Give every rank rank ``src``'s parameters and buffers."""
    if not is_distributed():
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=src)


def average_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """Replace each gradient by its mean over ranks (a missing gradient counts as zeros)."""
    if not is_distributed():
        return
    params = list(parameters)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        count = grad.numel()
        param.grad = flat[offset : offset + count].view_as(param).clone()
        offset += count


def replicas_agree(module: nn.Module) -> bool:
    """True when every rank holds bit-identical parameters (compares float64 sums and sums of squares)."""
    if not is_distributed():
        return True
    with torch.no_grad():
        local = torch.stack([s for p in module.parameters() for s in (p.double().sum(), p.double().pow(2).sum())])
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return all(torch.equal(gathered[0], other) for other in gathered[1:])


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each key's sum over ranks divided by the world size; a rank without the key adds 0.

    Ranks may report different keys (one that had no rows in a micro-batch reports none).
    """
    if not is_distributed():
        return metrics
    gathered: list[dict[str, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, metrics)
    keys = sorted(set().union(*(g or {} for g in gathered)))
    return {k: sum((g or {}).get(k, 0.0) for g in gathered) / len(gathered) for k in keys}


def any_over_ranks(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
    if not is_distributed():
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` of any rank (every rank gets the same answer)."""
    if not is_distributed():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
