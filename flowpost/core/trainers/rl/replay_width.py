"""``replay_steps_per_pass: auto``: the widest replay pass whose activations fit a memory budget.

A pass replays ``width`` stored steps of a micro-batch in one forward, so it keeps ``width x rows``
samples' activations for backward (``rows``: the micro-batch, twice with true CFG). Each sample's share
is the preflight's estimate (``core/memory.py``). The budget is ``train.replay_memory_gib`` where set;
otherwise, on CUDA, what the device has free after the weights, less the gradients and AdamW moments
the first step will allocate; on CPU, the network's weight bytes: a wider pass buys no parallelism
there once a step's matrix products fill the cores, so ``auto`` lets a pass's activations grow to about
the model's own size and no further.
"""

from __future__ import annotations

import torch

from flowpost.core.memory import ADAM_MOMENTS, GIB, activation_bytes
from flowpost.core.models.footprint import ModelFootprint

CUDA_USABLE = 0.9  # of the free device memory; the rest is left to workspace and fragmentation
HALF = (torch.bfloat16, torch.float16)


def replay_budget(device: torch.device, footprint: ModelFootprint, configured_gib: float | None) -> float:
    """Bytes a replay pass's activations may take on ``device``."""
    if configured_gib is not None:
        return configured_gib * GIB
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        first_step = (1 + ADAM_MOMENTS) * footprint.trainable_bytes  # gradients and AdamW moments
        return max(0.0, CUDA_USABLE * (free + cached) - first_step)
    return float(footprint.weight_bytes)


def auto_replay_width(
    footprint: ModelFootprint,
    *,
    steps: int,
    rows: int,
    text_tokens: int,
    dtype: torch.dtype,
    lora: bool,
    budget: float,
) -> int:
    """Stored steps per pass (1 to ``steps``): the most whose ``width x rows`` samples fit ``budget`` bytes."""
    per_sample = activation_bytes(
        footprint, text_tokens=text_tokens, activation_itemsize=2 if dtype in HALF else 4, lora=lora
    )
    return max(1, min(steps, int(budget // (rows * per_sample))))
