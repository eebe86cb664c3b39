"""Activation checkpointing of some of a transformer's blocks: ``gradient_checkpointing: N`` recomputes the
activations of the first N repeated blocks in backward and keeps the others' (Megatron-LM's ``block`` recompute
method), trading compute for memory block by block; ``true`` is every block (diffusers' own switch)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from flowpost.core.models.compile import repeated_blocks
from flowpost.errors import FlowpostError

MARK = "_flowpost_checkpointed"  # set on a block whose forward this module replaced

BlockCheckpointing = bool | int  # the ``gradient_checkpointing`` option: every block, none, or the first N


def _recomputed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    """``forward``'s output; under autograd its activations are recomputed in backward instead of kept."""
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def set_block_checkpointing(network: nn.Module, setting: BlockCheckpointing, *, where: str) -> None:
    """Checkpoint every block of ``network`` (``True``), none (``False`` or 0) or its first ``setting`` repeated
    blocks; replaces whatever was set before."""
    if isinstance(setting, int) and not isinstance(setting, bool) and setting < 0:
        raise FlowpostError(f"gradient_checkpointing is {setting}; give true, false or a number of blocks", where=where)
    blocks = repeated_blocks(network)
    for block in blocks:
        if block.__dict__.pop(MARK, False):
            del block.__dict__["forward"]  # back to the class's forward
    network.disable_gradient_checkpointing()  # type: ignore[operator]
    count = len(blocks) if setting is True else int(setting)
    if count >= len(blocks) > 0:
        network.enable_gradient_checkpointing()  # type: ignore[operator]
        return
    for block in blocks[:count]:
        block.forward = partial(_recomputed, block.forward)  # type: ignore[method-assign]
        block.__dict__[MARK] = True


def checkpointed_blocks(network: nn.Module) -> int:
    """How many of ``network``'s repeated blocks recompute their activations in backward."""
    blocks = repeated_blocks(network)
    if getattr(network, "is_gradient_checkpointing", False):
        return len(blocks)
    return sum(MARK in block.__dict__ for block in blocks)
