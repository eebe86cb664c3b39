"""Where each part of a stage's network keeps its numbers: trainable parameters in fp32, frozen ones as loaded."""

from __future__ import annotations

import torch
from torch import nn


def upcast_trainable(network: nn.Module) -> int:
    """Cast every trainable parameter of ``network`` to fp32 in place; the count of parameters cast.

    LoRA adapters that PEFT created in a half-precision base's dtype become fp32 (the base stays as
    loaded); a fully trained network becomes its own fp32 master copy. An Adam step of size ``lr``
    on a bf16 weight near 0.03 rounds away below lr ≈ 1e-4 (bf16's spacing there is 1.2e-4), so
    optimizer state and updates must live in fp32 whatever the frozen weights are.
    """
    cast = 0
    for parameter in network.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
            cast += 1
    return cast
