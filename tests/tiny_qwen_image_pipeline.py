"""A tiny random ``QwenImagePipeline`` (a Qwen2.5-VL text encoder, a tokenizer trained here) saved as a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tiny_sd3_pipeline import CORPUS

TEMPLATE_PREFIX = (  # the stock pipeline's prompt template up to the prompt: the 34 tokens it drops
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
)
TEMPLATE_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT_WIDTH = 32  # the Qwen2.5-VL hidden size: the transformer's joint_attention_dim
MAX_LENGTH = 16  # max_sequence_length given to the pipeline and the adapter
RESOLUTION = 16  # pixels: 8x8 latents, 4x4 = 16 packed tokens of 64 channels
TRANSFORMER: dict[str, Any] = {
    "patch_size": 2,
    "in_channels": 64,  # 16 latent channels packed 2x2
    "out_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": TEXT_WIDTH,
    "axes_dims_rope": (2, 2, 4),  # sums to attention_head_dim
}
VAE: dict[str, Any] = {  # Qwen-Image's 16 latent channels and their latents_mean / latents_std (the defaults)
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 2],
    "num_res_blocks": 1,
    "temperal_downsample": [False],  # vae_scale_factor 2
}
SCHEDULER: dict[str, Any] = {  # Qwen-Image's scheduler config
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 0.9,
    "base_image_seq_len": 256,
    "max_image_seq_len": 8192,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
}


def qwen_tokenizer() -> Any:
    """A byte-level BPE trained on ``CORPUS`` and the prompt template with Qwen2's pre-tokenization, as a
    ``Qwen2Tokenizer``: every word of the template is one token, so its prefix is the stock 34 tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    texts = [TEMPLATE_PREFIX + prompt + TEMPLATE_SUFFIX for prompt in CORPUS]
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    return tokenizer


def qwen_text_encoder(vocab_size: int) -> Any:
    """A random two-layer Qwen2.5-VL (its vision tower tiny too; the pipeline feeds it text only)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4], "rope_theta": 1e6},
            "bos_token_id": None,
            "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 32},
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def build_tiny_qwen_image_pipeline(folder: Path, *, seed: int = 0) -> Path:
    """Assemble a random Qwen-Image pipeline (a few MB) and save it to ``folder``."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    tokenizer = qwen_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = QwenImagePipeline(
            transformer=QwenImageTransformer2DModel(**TRANSFORMER),
            scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
            vae=AutoencoderKLQwenImage(**VAE),
            text_encoder=qwen_text_encoder(len(tokenizer)),
            tokenizer=tokenizer,
        )
    pipeline.save_pretrained(folder)
    return folder


def load_qwen_image_adapter(folder: Path, **options: Any) -> Any:
    """The qwen-image family loaded from ``folder`` through the registry, at this pipeline's length and size."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    source = PretrainedSource(str(folder), **options)
    adapter = adapter_class("qwen-image").from_pipeline(source, resolution=RESOLUTION)
    adapter.encoder_max_length = MAX_LENGTH
    return adapter
