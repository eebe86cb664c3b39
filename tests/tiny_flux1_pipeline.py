"""A tiny random ``FluxPipeline`` (dev, or schnell without the guidance embedding) saved as a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_sd3_pipeline import T5_LENGTH, T5_WIDTH, clip_encoder, clip_tokenizer, t5_encoder, t5_tokenizer

CLIP_WIDTH = 32  # the pooled CLIP vector's width
RESOLUTION = 16  # pixels: 8x8 latents, 4x4 = 16 packed tokens of 64 channels
TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,  # 16 latent channels packed 2x2
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": T5_WIDTH,
    "pooled_projection_dim": CLIP_WIDTH,
    "axes_dims_rope": (2, 2, 4),  # sums to attention_head_dim
}
VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "block_out_channels": (8, 16),  # vae_scale_factor 2
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "shift_factor": 0.1159,  # FLUX.1's
    "scaling_factor": 0.3611,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
SCHEDULERS: dict[str, dict[str, Any]] = {  # FLUX.1-dev's and FLUX.1-schnell's scheduler configs
    "dev": {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15},
    "schnell": {"shift": 1.0, "use_dynamic_shifting": False},
}


def build_tiny_flux1_pipeline(folder: Path, *, variant: str = "dev", seed: int = 0) -> Path:
    """Assemble a random FLUX.1 pipeline (``dev``: guidance embedding; ``schnell``: none) and save it."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = FluxPipeline(
            transformer=FluxTransformer2DModel(**TRANSFORMER, guidance_embeds=variant == "dev"),
            scheduler=FlowMatchEulerDiscreteScheduler(
                base_image_seq_len=256, max_image_seq_len=4096, **SCHEDULERS[variant]
            ),
            vae=AutoencoderKL(**VAE),
            text_encoder=clip_encoder(CLIP_WIDTH, len(tokenizer), projection=False),
            tokenizer=tokenizer,
            text_encoder_2=t5_encoder(len(tokenizer_2)),
            tokenizer_2=tokenizer_2,
        )
    pipeline.save_pretrained(folder)
    return folder


def load_flux1_adapter(folder: Path, **options: Any) -> Any:
    """The flux1 family loaded from ``folder`` through the registry, at this pipeline's T5 length and size."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    adapter = adapter_class("flux1").from_pipeline(PretrainedSource(str(folder), **options), resolution=RESOLUTION)
    adapter.encoder_max_length = T5_LENGTH
    return adapter
