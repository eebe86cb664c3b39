"""What sizing a stage reads from its model: parameter counts and bytes, the transformer's width and
repeated blocks, and the tokens one sample feeds it. Works alike on a loaded adapter and on one whose
transformer sits on the meta device (``PipelineFamily.without_weights``), so no weight is read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.block_checkpointing import checkpointed_blocks
from flowpost.core.models.compile import repeated_blocks
from flowpost.core.models.quantize import tensor_bytes


@dataclass(frozen=True)
class ModelFootprint:
    """One trainable network's size: all its parameters (LoRA layers included) and the trainable ones."""

    parameters: int
    trainable: int
    weight_bytes: int  # every parameter and buffer in its own dtype (a quantized one: its 8-bit values and scales)
    trainable_bytes: int  # the trainable ones in their dtype
    blocks: int  # repeated transformer blocks
    hidden: int  # attention heads x head width
    image_tokens: int  # latent tokens of one sample (frames included), with its conditions' image tokens
    checkpointed: int  # gradient checkpointing: the blocks whose activations are recomputed in backward
    pixels: tuple[int, ...] = ()  # one sample's pixels as its VAE encodes them; () without a VAE
    widest_projection: int = 0  # the widest linear output in the repeated blocks (a fused projection's whole width)


def model_footprint(adapter: ModelAdapter) -> ModelFootprint:
    """``adapter``'s network as it would train (after ``add_lora`` when the stage uses LoRA)."""
    network = adapter.module()
    params = list(network.parameters())
    trainable = [p for p in params if p.requires_grad]
    config = network.config  # type: ignore[attr-defined]
    routed = int(getattr(network, "routed_experts", 1))  # experts of which one runs each sample (Wan2.2-A14B's)
    blocks = repeated_blocks(network)
    return ModelFootprint(
        parameters=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in trainable),
        weight_bytes=sum(tensor_bytes(p) for p in params) + sum(tensor_bytes(b) for b in network.buffers()),
        trainable_bytes=sum(tensor_bytes(p) for p in trainable),
        blocks=len(blocks) // routed,
        hidden=attention_width(config),
        image_tokens=image_tokens(adapter) + adapter.condition_tokens,
        checkpointed=checkpointed_blocks(network) // routed,
        pixels=tuple(getattr(adapter, "pixel_shape", ())),
        widest_projection=widest_projection(blocks),
    )


def widest_projection(blocks: list[nn.Module]) -> int:
    """The most output features of a linear layer in ``blocks`` (FLUX.2's single-stream blocks project to
    attention's q, k, v and the gated MLP's two halves in one layer, nine times the width)."""
    return max(
        (layer.out_features for block in blocks for layer in block.modules() if isinstance(layer, nn.Linear)), default=0
    )


def attention_width(config: Any) -> int:
    """Attention heads x head width, from a transformer's config (Z-Image's names the product ``dim``)."""
    if "num_attention_heads" in config:
        return int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    return int(config["dim"])


def image_tokens(adapter: ModelAdapter) -> int:
    """Tokens the transformer sees per sample: packed latents' token count, or the latent grid over its patches."""
    shape = adapter.latent_shape
    if len(shape) == 2:  # already [tokens, channels]
        return int(shape[0])
    grid = shape[1:]
    config = adapter.module().config  # type: ignore[attr-defined]
    patch = config["patch_size"] if "patch_size" in config else config["all_patch_size"][0]  # Z-Image: its first
    patches = tuple(patch) if isinstance(patch, (list, tuple)) else (1,) * (len(grid) - 2) + (patch, patch)
    return math.prod(side // size for side, size in zip(grid, patches, strict=True))
