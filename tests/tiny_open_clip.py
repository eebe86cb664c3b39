"""A tiny random open_clip ViT CLIP, written as an HPS-style checkpoint, with its model config and a CLIP
tokenizer; and open_clip's forward pass written out on the raw tensors, as a reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
VISION = {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8}
TEXT = {"context_length": 16, "width": 32, "heads": 2, "layers": 2}
EMBED_DIM = 16


def write_clip_tokenizer(folder: Path) -> int:
    """A character-level CLIP BPE tokenizer in ``folder`` whose end-of-text token has the highest id, as in
    the CLIP vocabulary; returns the vocabulary size."""
    folder.mkdir(parents=True, exist_ok=True)
    pieces = [*CHARACTERS, *(character + "</w>" for character in CHARACTERS), "<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({piece: index for index, piece in enumerate(pieces)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return len(pieces)


def _blocks(prefix: str, width: int, layers: int, generator: torch.Generator) -> dict[str, Tensor]:
    def normal(*shape: int, std: float) -> Tensor:
        return torch.randn(*shape, generator=generator) * std

    state = {}
    for index in range(layers):
        block = f"{prefix}transformer.resblocks.{index}."
        for norm in ("ln_1", "ln_2"):
            state[f"{block}{norm}.weight"] = 1 + normal(width, std=0.1)
            state[f"{block}{norm}.bias"] = normal(width, std=0.1)
        state[f"{block}attn.in_proj_weight"] = normal(3 * width, width, std=width**-0.5)
        state[f"{block}attn.in_proj_bias"] = normal(3 * width, std=0.1)
        state[f"{block}attn.out_proj.weight"] = normal(width, width, std=width**-0.5)
        state[f"{block}attn.out_proj.bias"] = normal(width, std=0.1)
        state[f"{block}mlp.c_fc.weight"] = normal(4 * width, width, std=width**-0.5)
        state[f"{block}mlp.c_fc.bias"] = normal(4 * width, std=0.1)
        state[f"{block}mlp.c_proj.weight"] = normal(width, 4 * width, std=(4 * width) ** -0.5)
        state[f"{block}mlp.c_proj.bias"] = normal(width, std=0.1)
    return state


def open_clip_state(vocab_size: int, seed: int = 0) -> dict[str, Tensor]:
    """Random weights under open_clip's names and shapes for ``VISION``, ``TEXT`` and ``EMBED_DIM``."""
    generator = torch.Generator().manual_seed(seed)
    vision, text = VISION["width"], TEXT["width"]
    patches = (VISION["image_size"] // VISION["patch_size"]) ** 2
    state = {
        "visual.conv1.weight": torch.randn(vision, 3, VISION["patch_size"], VISION["patch_size"], generator=generator)
        * 0.05,
        "visual.class_embedding": torch.randn(vision, generator=generator),
        "visual.positional_embedding": torch.randn(patches + 1, vision, generator=generator) * 0.5,
        "token_embedding.weight": torch.randn(vocab_size, text, generator=generator),
        "positional_embedding": torch.randn(TEXT["context_length"], text, generator=generator) * 0.5,
        "visual.proj": torch.randn(vision, EMBED_DIM, generator=generator) * vision**-0.5,
        "text_projection": torch.randn(text, EMBED_DIM, generator=generator) * text**-0.5,
        "logit_scale": torch.tensor(math.log(100.0)),
    }
    for norm, width in (("visual.ln_pre", vision), ("visual.ln_post", vision), ("ln_final", text)):
        state[f"{norm}.weight"] = 1 + torch.randn(width, generator=generator) * 0.1
        state[f"{norm}.bias"] = torch.randn(width, generator=generator) * 0.1
    state |= _blocks("visual.", vision, VISION["layers"], generator)
    state |= _blocks("", text, TEXT["layers"], generator)
    return state


def build_tiny_open_clip(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Write ``config`` (open_clip model config), ``checkpoint`` (``{"state_dict": ...}`` as HPS ships it)
    and a ``tokenizer`` folder under ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = write_clip_tokenizer(folder / "tokenizer")
    config = {"embed_dim": EMBED_DIM, "vision_cfg": VISION, "text_cfg": {**TEXT, "vocab_size": vocab_size}}
    (folder / "config.json").write_text(json.dumps(config))
    torch.save({"state_dict": open_clip_state(vocab_size, seed), "epoch": 1}, folder / "hps.pt")
    return {"config": folder / "config.json", "checkpoint": folder / "hps.pt", "tokenizer": folder / "tokenizer"}


def _layer_norm(x: Tensor, state: dict[str, Tensor], name: str) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], state[f"{name}.weight"], state[f"{name}.bias"])


def _transformer(x: Tensor, state: dict[str, Tensor], prefix: str, heads: int, mask: Tensor | None) -> Tensor:
    """open_clip's ResidualAttentionBlocks: pre-norm torch ``nn.MultiheadAttention`` and a GELU MLP."""
    width = x.shape[-1]
    index = 0
    while f"{prefix}transformer.resblocks.{index}.ln_1.weight" in state:
        block = f"{prefix}transformer.resblocks.{index}."
        attention = nn.MultiheadAttention(width, heads, batch_first=True)
        attention.load_state_dict(
            {key[len(block) + 5 :]: v for key, v in state.items() if key.startswith(block + "attn.")}
        )
        h = _layer_norm(x, state, block + "ln_1")
        x = x + attention(h, h, h, need_weights=False, attn_mask=mask)[0]
        h = F.gelu(
            F.linear(
                _layer_norm(x, state, block + "ln_2"), state[block + "mlp.c_fc.weight"], state[block + "mlp.c_fc.bias"]
            )
        )
        x = x + F.linear(h, state[block + "mlp.c_proj.weight"], state[block + "mlp.c_proj.bias"])
        index += 1
    return x


@torch.no_grad()
def encode_image(state: dict[str, Tensor], pixels: Tensor) -> Tensor:
    """open_clip's ``encode_image`` (not normalised) on normalised pixels [B, 3, S, S]."""
    x = F.conv2d(pixels, state["visual.conv1.weight"], stride=VISION["patch_size"]).flatten(2).transpose(1, 2)
    x = (
        torch.cat([state["visual.class_embedding"].expand(len(x), 1, -1), x], dim=1)
        + state["visual.positional_embedding"]
    )
    x = _transformer(
        _layer_norm(x, state, "visual.ln_pre"), state, "visual.", VISION["width"] // VISION["head_width"], None
    )
    return _layer_norm(x[:, 0], state, "visual.ln_post") @ state["visual.proj"]


@torch.no_grad()
def encode_text(state: dict[str, Tensor], ids: Tensor) -> Tensor:
    """open_clip's ``encode_text`` (not normalised): a causal mask, the features at the highest token id."""
    length = ids.shape[1]
    x = state["token_embedding.weight"][ids] + state["positional_embedding"][:length]
    mask = torch.full((length, length), float("-inf")).triu(1)
    x = _layer_norm(_transformer(x, state, "", TEXT["heads"], mask), state, "ln_final")
    return x[torch.arange(len(ids)), ids.argmax(-1)] @ state["text_projection"]
