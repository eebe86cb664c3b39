"""``torch.compile`` of a diffusers transformer: regionally (each repeated block compiled on its own, as
diffusers' ``compile_repeated_blocks``: one compilation serves every block of a class) or as a whole.

Modules compile in place (``nn.Module.compile``), so parameter names, state dicts, LoRA and snapshots
are unchanged; a deep copy comes back uncompiled, so role copies are compiled again when declared.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from flowpost.errors import FlowpostError

BLOCK_LISTS = ("transformer_blocks", "single_transformer_blocks", "blocks")  # where diffusers keeps its blocks


def repeated_block_classes(network: nn.Module) -> set[str]:
    """The class names of ``network``'s repeated blocks: diffusers' ``_repeated_blocks`` where the model
    declares them (FLUX.1, Qwen-Image, Wan), else the classes of its block lists (SD3's joint blocks)."""
    declared = getattr(network, "_repeated_blocks", None)
    if declared:
        return set(declared)
    return {
        type(block).__name__
        for name in BLOCK_LISTS
        if isinstance(blocks := getattr(network, name, None), nn.ModuleList)
        for block in blocks
    }


def compile_network(
    network: nn.Module, *, regional: bool, options: dict[str, Any], where: str = "model.compile"
) -> list[nn.Module]:
    """Compile ``network``'s repeated blocks (``regional``) or ``network`` itself with ``torch.compile(**options)``;
    the modules compiled, in order."""
    blocks = repeated_blocks(network) if regional else [network]
    if not blocks:
        raise FlowpostError(
            f"{type(network).__name__} has no repeated transformer blocks to compile; set regional: false", where=where
        )
    for block in blocks:
        if not is_compiled(block):  # a role network may be the transformer, compiled already
            block.compile(**options)
    return blocks


def repeated_blocks(network: nn.Module) -> list[nn.Module]:
    """``network``'s modules of its repeated block classes, in module order."""
    classes = repeated_block_classes(network)
    return [module for module in network.modules() if type(module).__name__ in classes]


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` runs through a ``torch.compile``d call."""
    return getattr(module, "_compiled_call_impl", None) is not None
