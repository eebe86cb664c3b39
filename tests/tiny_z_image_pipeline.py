"""A tiny random ``ZImagePipeline`` (a Qwen3 text encoder, a tokenizer trained here with a chat template) saved
as a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_qwen_image_pipeline import SPECIAL_TOKENS, qwen_tokenizer

# Qwen3's chat template as the stock pipeline renders it (one user turn, the generation prompt, thinking on)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
TEXT_WIDTH = 32  # the Qwen3 hidden size: the transformer's cap_feat_dim
MAX_LENGTH = 24  # max_sequence_length given to the pipeline and the adapter
RESOLUTION = 16  # pixels: 8x8 latents of 16 channels, 4x4 = 16 image tokens
TRANSFORMER: dict[str, Any] = {
    "all_patch_size": (2,),
    "all_f_patch_size": (1,),
    "in_channels": 16,
    "dim": 32,
    "n_layers": 2,
    "n_refiner_layers": 1,
    "n_heads": 2,
    "n_kv_heads": 2,
    "cap_feat_dim": TEXT_WIDTH,
    "axes_dims": [4, 6, 6],  # sums to the head width, dim / n_heads
    "axes_lens": [64, 16, 16],
}
VAE: dict[str, Any] = {  # FLUX.1's 16-channel AutoencoderKL, two blocks
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "block_out_channels": (8, 16),  # vae_scale_factor 2
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "shift_factor": 0.1159,
    "scaling_factor": 0.3611,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
SCHEDULER: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}  # Turbo's


def z_image_tokenizer() -> Any:
    """The Qwen2 byte-level BPE trained here, with Qwen3's chat template."""
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def qwen3_text_encoder(vocab_size: int) -> Any:
    """A random two-layer ``Qwen3Model``."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=TEXT_WIDTH,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
    )
    return Qwen3Model(config)


def build_tiny_z_image_pipeline(folder: Path, *, seed: int = 0) -> Path:
    """Assemble a random Z-Image pipeline (a few MB) and save it to ``folder``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    tokenizer = z_image_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = ZImagePipeline(
            transformer=ZImageTransformer2DModel(**TRANSFORMER),
            scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
            vae=AutoencoderKL(**VAE),
            text_encoder=qwen3_text_encoder(len(tokenizer)),
            tokenizer=tokenizer,
        )
    pipeline.save_pretrained(folder)
    return folder


def load_z_image_adapter(folder: Path, **options: Any) -> Any:
    """The z-image family loaded from ``folder`` through the registry, at this pipeline's length and size."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    source = PretrainedSource(str(folder), **options)
    adapter = adapter_class("z-image").from_pipeline(source, resolution=RESOLUTION)
    adapter.encoder_max_length = MAX_LENGTH
    return adapter
