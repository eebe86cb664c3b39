"""The sd3 family against the stock diffusers SD3 pipeline, on a tiny random pipeline folder."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_sd3_pipeline import T5_LENGTH


def test_the_stock_pipeline_loads_the_folder_and_generates(sd3_pipeline_dir: Path) -> None:
    from diffusers import StableDiffusion3Pipeline

    pipeline = StableDiffusion3Pipeline.from_pretrained(sd3_pipeline_dir)
    images = pipeline(
        "a red cat",
        num_inference_steps=2,
        guidance_scale=4.0,
        max_sequence_length=T5_LENGTH,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert images.shape == (1, 3, 16, 16)
    assert torch.isfinite(images).all() and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0
