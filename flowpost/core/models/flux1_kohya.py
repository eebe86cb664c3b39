"""FLUX.1's kohya LoRA layout: the original (Black Forest Labs) module names, whose attention projections are
fused (``img_attn.qkv``; a single block's ``linear1`` holds q, k, v and the MLP input)."""

from __future__ import annotations

import re

from flowpost.core.models.kohya_lora import KohyaLayout, KohyaModule

_BLOCK = re.compile(r"(single_transformer_blocks|transformer_blocks)\.(\d+)\.(.+)")
_DOUBLE_FUSED = {  # original module -> its diffusers parts (output rows: one input width each)
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
_DOUBLE = {
    "attn.to_out.0": "img_attn.proj",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "norm1.linear": "img_mod.lin",
    "attn.to_add_out": "txt_attn.proj",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
    "norm1_context.linear": "txt_mod.lin",
}
_LINEAR1 = (("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), (1, 1, 1, 4))  # the MLP is 4x as wide
_SINGLE = {"proj_out": "linear2", "norm.linear": "modulation.lin"}
UNNAMED = (  # outside the blocks: diffusers' kohya conversion leaves off their transformer prefix and drops them
    "x_embedder",
    "context_embedder",
    "time_text_embed.timestep_embedder.linear_1",
    "time_text_embed.timestep_embedder.linear_2",
    "time_text_embed.text_embedder.linear_1",
    "time_text_embed.text_embedder.linear_2",
    "time_text_embed.guidance_embedder.linear_1",
    "time_text_embed.guidance_embedder.linear_2",
    "norm_out.linear",
    "proj_out",
)


def flux1_kohya_module(path: str) -> KohyaModule | None:
    """The original FLUX.1 module holding diffusers module ``path`` of a double or single block."""
    match = _BLOCK.fullmatch(path)
    if match is None:
        return None
    kind, index, inner = match.groups()
    here = f"{kind}.{index}."
    if kind == "single_transformer_blocks":
        there = f"single_blocks.{index}."
        parts, widths = _LINEAR1
        if inner in parts:
            return KohyaModule(there + "linear1", tuple(here + part for part in parts), widths)
        return KohyaModule(there + _SINGLE[inner], (path,)) if inner in _SINGLE else None
    there = f"double_blocks.{index}."
    for name, parts in _DOUBLE_FUSED.items():
        if inner in parts:
            return KohyaModule(there + name, tuple(here + part for part in parts), (1, 1, 1))
    return KohyaModule(there + _DOUBLE[inner], (path,)) if inner in _DOUBLE else None


FLUX1_KOHYA = KohyaLayout(flux1_kohya_module, {"ss_network_module": "networks.lora_flux"}, UNNAMED)
