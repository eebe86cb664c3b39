"""Tiny random ``WanPipeline``s (text to video) built locally (their tokenizer trained here) and saved as folders: a
Wan2.1-shaped one and a Wan2.2-A14B-shaped one with two experts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_sd3_pipeline import T5_LENGTH, t5_tokenizer

UMT5_WIDTH = 32
HEIGHT, WIDTH, FRAMES = 16, 32, 5  # pixels and frames: latents [4, 2, 4, 8] (4x temporal and spatial)
LATENT_CHANNELS = 4
TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "in_channels": LATENT_CHANNELS,
    "out_channels": LATENT_CHANNELS,
    "text_dim": UMT5_WIDTH,
    "freq_dim": 16,
    "ffn_dim": 32,
    "num_layers": 2,
    "rope_max_seq_len": 32,
}
VAE: dict[str, Any] = {  # Wan2.1's layout (causal 3-D convolutions, 4x4x4 compression) at a small width
    "base_dim": 8,
    "z_dim": LATENT_CHANNELS,
    "dim_mult": [1, 1, 1],
    "num_res_blocks": 1,
    "temperal_downsample": [True, True],
    "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075],  # Wan2.1's first four channels
    "latents_std": [2.8184, 1.4541, 2.3275, 2.6558],
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 4,
}
FLOW_SHIFT = 3.0  # Wan2.1 at 480p
BOUNDARY_RATIO = 0.875  # Wan2.2-T2V-A14B's: the high-noise expert at timesteps >= 875


def umt5_encoder(vocab_size: int) -> Any:
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=UMT5_WIDTH,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
    )
    return UMT5EncoderModel(config)


def build_tiny_wan2_pipeline(folder: Path, *, seed: int = 0) -> Path:
    """Assemble a random Wan2.1-shaped T2V pipeline (a flow-match Euler scheduler at ``FLOW_SHIFT``) and save it."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    tokenizer = t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = WanPipeline(
            transformer=WanTransformer3DModel(**TRANSFORMER),
            scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT),
            vae=AutoencoderKLWan(**VAE),
            text_encoder=umt5_encoder(len(tokenizer)),
            tokenizer=tokenizer,
        )
    pipeline.save_pretrained(folder)
    return folder


def build_tiny_wan22_pipeline(folder: Path, *, seed: int = 0) -> Path:
    """The same pipeline with a second expert of its own random weights: ``transformer`` at timesteps at or above
    ``BOUNDARY_RATIO * 1000``, ``transformer_2`` below, as Wan2.2-T2V-A14B."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    tokenizer = t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = WanPipeline(
            transformer=WanTransformer3DModel(**TRANSFORMER),
            transformer_2=WanTransformer3DModel(**TRANSFORMER),
            boundary_ratio=BOUNDARY_RATIO,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT),
            vae=AutoencoderKLWan(**VAE),
            text_encoder=umt5_encoder(len(tokenizer)),
            tokenizer=tokenizer,
        )
    pipeline.save_pretrained(folder)
    return folder


def load_wan2_adapter(
    folder: Path, *, family: str = "wan2", options: dict[str, Any] | None = None, **source: Any
) -> Any:
    """Family ``family`` loaded from ``folder`` through the registry with ``options``, at this pipeline's size and
    token length; ``source``: ``PretrainedSource`` fields."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    adapter = adapter_class(family).from_pipeline(
        PretrainedSource(str(folder), **source), height=HEIGHT, width=WIDTH, num_frames=FRAMES, **(options or {})
    )
    adapter.encoder_max_length = T5_LENGTH
    return adapter
