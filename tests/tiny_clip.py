"""A tiny random CLIP model with a character-level BPE tokenizer and a CLIP image processor, saved locally."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
PROJECTION = 16  # the embeddings' width


def build_tiny_clip(folder: Path) -> Path:
    """Write the model, tokenizer and processor to ``folder`` (seeded: the same weights every time)."""
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
        "size": {"shortest_edge": 32},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": MEAN,
        "image_std": STD,
        "do_convert_rgb": True,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    text = {**tower, "vocab_size": len(vocab), "max_position_embeddings": 32}
    config = CLIPConfig(
        text_config={**text, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1},
        vision_config={**tower, "image_size": 32, "patch_size": 8},
        projection_dim=PROJECTION,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    return folder
