"""A random CLIP model with a character-level BPE tokenizer and a CLIP image processor, saved locally: tiny
for the tests, or at a published width (``VIT_B_32``) for benches."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
PROJECTION = 16  # the embeddings' width
TINY = {
    "width": 32,
    "layers": 2,
    "heads": 2,
    "mlp_ratio": 2,
    "text_positions": 32,
    "image_size": 32,
    "patch_size": 8,
    "projection": PROJECTION,
}
# openai/clip-vit-base-patch32's towers (text 512 wide, 8 heads; vision 768 wide, 12 heads; 12 layers each)
VIT_B_32 = {
    "width": (512, 768),
    "layers": 12,
    "heads": (8, 12),
    "mlp_ratio": 4,
    "text_positions": 77,
    "image_size": 224,
    "patch_size": 32,
    "projection": 512,
}


def build_tiny_clip(folder: Path) -> Path:
    """The tests' tiny CLIP in ``folder`` (seeded: the same weights every time)."""
    return build_clip(folder, **TINY)


def build_clip(
    folder: Path,
    *,
    width: int | tuple[int, int],
    layers: int,
    heads: int | tuple[int, int],
    mlp_ratio: int,
    text_positions: int,
    image_size: int,
    patch_size: int,
    projection: int,
) -> Path:
    """Write a seeded random CLIP (``width``, ``heads``: one for both towers, or text then vision), its
    tokenizer and its image processor to ``folder``."""
    from transformers import CLIPConfig, CLIPModel

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        vocab.update({character + suffix: len(vocab) + i for i, character in enumerate(CHARACTERS)})
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    processor = {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": image_size},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": image_size, "width": image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": MEAN,
        "image_std": STD,
        "do_convert_rgb": True,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    widths = width if isinstance(width, tuple) else (width, width)
    head_counts = heads if isinstance(heads, tuple) else (heads, heads)
    text, vision = (
        {
            "hidden_size": w,
            "intermediate_size": mlp_ratio * w,
            "num_hidden_layers": layers,
            "num_attention_heads": h,
        }
        for w, h in zip(widths, head_counts, strict=True)
    )
    config = CLIPConfig(
        text_config={
            **text,
            "vocab_size": len(vocab),
            "max_position_embeddings": text_positions,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config={**vision, "image_size": image_size, "patch_size": patch_size},
        projection_dim=projection,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    return folder
