"""A tiny random ``FluxKontextPipeline`` saved as a folder: the tiny FLUX.1-dev transformer, text encoders and
scheduler, with a VAE of factor 16 so that a source read at the stock 1024 x 1024 gives 32 x 32 packed tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_flux1_pipeline import CLIP_WIDTH, SCHEDULERS, TRANSFORMER
from tiny_flux1_pipeline import VAE as FLUX1_VAE
from tiny_sd3_pipeline import T5_LENGTH, T5_WIDTH, clip_encoder, clip_tokenizer, t5_encoder, t5_tokenizer

RESOLUTION = 64  # target pixels: 4x4 latents (VAE factor 16), 2x2 = 4 packed tokens of 64 channels
SOURCE_TOKENS = (1024 // 32) ** 2  # a square source at the stock 1024 px: 32x32 packed tokens
LATENT_CHANNELS = 16
VAE: dict[str, Any] = {  # FLUX.1's VAE (16 latent channels, its shift and scale) at a 16x spatial factor
    **FLUX1_VAE,
    "down_block_types": ("DownEncoderBlock2D",) * 5,
    "up_block_types": ("UpDecoderBlock2D",) * 5,
    "block_out_channels": (8, 8, 8, 8, 16),
}


def build_tiny_flux1_kontext_pipeline(folder: Path, *, seed: int = 0) -> Path:
    """Assemble a random FLUX.1-Kontext-dev pipeline (a few MB) and save it to ``folder``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel

    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = FluxKontextPipeline(
            transformer=FluxTransformer2DModel(**TRANSFORMER, guidance_embeds=True),
            scheduler=FlowMatchEulerDiscreteScheduler(
                base_image_seq_len=256, max_image_seq_len=4096, **SCHEDULERS["dev"]
            ),
            vae=AutoencoderKL(**VAE),
            text_encoder=clip_encoder(CLIP_WIDTH, len(tokenizer), projection=False),
            tokenizer=tokenizer,
            text_encoder_2=t5_encoder(len(tokenizer_2)),
            tokenizer_2=tokenizer_2,
        )
    pipeline.save_pretrained(folder)
    return folder


def load_flux1_kontext_adapter(folder: Path, **options: Any) -> Any:
    """The flux1-kontext family loaded from ``folder`` through the registry, at this pipeline's T5 length and size."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    source = PretrainedSource(str(folder), **options)
    adapter = adapter_class("flux1-kontext").from_pipeline(source, resolution=RESOLUTION)
    adapter.encoder_max_length = T5_LENGTH
    return adapter


def seeded_kontext_latents(prompts: list[str], *, grid: int = 4) -> torch.Tensor:
    """Seeded unpacked source latents ``[B, 16, 2 * grid, 2 * grid]``, one generator per prompt."""
    generators = [torch.Generator().manual_seed(sum(map(ord, prompt)) + grid) for prompt in prompts]
    return torch.stack([torch.randn(LATENT_CHANNELS, 2 * grid, 2 * grid, generator=g) for g in generators])


def seeded_kontext_states(prompts: list[str], *, grid: int = 4) -> Any:
    """Seeded edit conditions without an encoder, one generator per prompt: ``T5_LENGTH`` token states of
    ``T5_WIDTH``, a pooled vector of ``CLIP_WIDTH`` and ``grid x grid`` packed source tokens (of
    ``seeded_kontext_latents``) flattened after it in ``pooled``."""
    from diffusers import FluxKontextPipeline

    from flowpost.core.conditions import ConditionBatch

    generators = [torch.Generator().manual_seed(sum(map(ord, prompt))) for prompt in prompts]
    states = torch.stack([torch.randn(T5_LENGTH, T5_WIDTH, generator=g) for g in generators])
    pooled = torch.stack([torch.randn(CLIP_WIDTH, generator=g) for g in generators])
    side = 2 * grid
    packed = FluxKontextPipeline._pack_latents(seeded_kontext_latents(prompts, grid=grid), len(prompts), 16, side, side)
    mask = torch.ones(len(prompts), T5_LENGTH, dtype=torch.int8)
    return ConditionBatch(states, mask, torch.cat([pooled, packed.reshape(len(prompts), -1)], dim=1))
