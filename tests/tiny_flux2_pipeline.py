"""Tiny random FLUX.2 pipelines saved as folders: ``Flux2Pipeline`` (dev: a Mistral-3 text encoder, a guidance
embedding) and ``Flux2KleinPipeline`` (a Qwen3 text encoder, no guidance embedding), tokenizers trained here.

FLUX.2-dev's tokenizer is a ``PixtralProcessor``, which needs torchvision; the stock pipeline calls only its
``apply_chat_template``, so the dev folder carries a plain fast tokenizer with a Mistral-style chat template.
The text encoders have as many layers as the stock pipelines read hidden states from (30 and 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tiny_sd3_pipeline import CORPUS
from tiny_z_image_pipeline import SPECIAL_TOKENS, z_image_tokenizer

TEXT_WIDTH = 16  # the text encoders' hidden size; the transformer reads three layers: 48 wide
DEV_MAX_LENGTH = 64  # max_sequence_length for dev: the system message is most of it
KLEIN_MAX_LENGTH = 24
RESOLUTION = 16  # pixels: 8x8 latents of 4 channels, 4x4 = 16 tokens of 16 channels
TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 16,  # 4 latent channels in 2x2 patches
    "num_layers": 1,
    "num_single_layers": 1,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 3 * TEXT_WIDTH,
    "timestep_guidance_channels": 16,
    "axes_dims_rope": (2, 2, 2, 2),  # sums to attention_head_dim
}
VAE: dict[str, Any] = {
    "latent_channels": 4,
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "block_out_channels": (8, 16),  # vae_scale_factor 2
    "layers_per_block": 1,
    "norm_num_groups": 8,
}
SCHEDULER: dict[str, Any] = {  # FLUX.2's: dynamic shifting (the pipelines pass their own mu)
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
    "time_shift_type": "exponential",
}
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
# a text-only Mistral-3 chat template: the system turn, then the user turn; contents are lists of text parts
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set text = message['content'] if message['content'] is string else message['content'][0]['text'] %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% else %}[INST]{{ text }}[/INST]{% endif %}{% endfor %}"
)


def mistral_tokenizer() -> Any:
    """A byte-level BPE trained on ``CORPUS`` and the pipeline's system message, with the template above."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=MISTRAL_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([SYSTEM_MESSAGE, *CORPUS], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=MISTRAL_TEMPLATE,
    )


def mistral3_text_encoder(vocab_size: int) -> Any:
    """A random 30-layer ``Mistral3ForConditionalGeneration`` (its vision tower tiny; the pipeline feeds text)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text = {
        "model_type": "mistral",
        "vocab_size": vocab_size,
        "hidden_size": TEXT_WIDTH,
        "intermediate_size": 32,
        "num_hidden_layers": 30,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "max_position_embeddings": 256,
    }
    vision = {
        "model_type": "pixtral",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "head_dim": 8,
        "image_size": 32,
        "patch_size": 16,
    }
    return Mistral3ForConditionalGeneration(Mistral3Config(text_config=text, vision_config=vision))


def qwen3_causal_encoder(vocab_size: int) -> Any:
    """A random 27-layer ``Qwen3ForCausalLM``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=TEXT_WIDTH,
        intermediate_size=32,
        num_hidden_layers=27,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
    )
    return Qwen3ForCausalLM(config)


def _vae() -> Any:
    """The VAE with random batch-norm statistics (fresh ones are 0 and 1, which would hide a missing step)."""
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(**VAE)
    vae.bn.running_mean.uniform_(-0.5, 0.5)
    vae.bn.running_var.uniform_(0.5, 2.0)
    return vae


def build_tiny_flux2_pipeline(folder: Path, *, variant: str = "dev", seed: int = 0, distilled: bool = False) -> Path:
    """Assemble a random FLUX.2 pipeline (``dev`` or ``klein``; ``distilled`` sets klein's ``is_distilled``)
    of a few MB and save it to ``folder``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline, Flux2Transformer2DModel

    dev = variant == "dev"
    tokenizer = mistral_tokenizer() if dev else z_image_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parts = {
            "transformer": Flux2Transformer2DModel(**TRANSFORMER, guidance_embeds=dev),
            "scheduler": FlowMatchEulerDiscreteScheduler(**SCHEDULER),
            "vae": _vae(),
            "tokenizer": tokenizer,
        }
        if dev:
            pipeline = Flux2Pipeline(text_encoder=mistral3_text_encoder(len(tokenizer)), **parts)
        else:
            encoder = qwen3_causal_encoder(len(tokenizer))
            pipeline = Flux2KleinPipeline(text_encoder=encoder, is_distilled=distilled, **parts)
    pipeline.save_pretrained(folder)
    return folder


def load_flux2_adapter(folder: Path, **options: Any) -> Any:
    """The flux2 (dev) family loaded from ``folder`` through the registry, at this pipeline's length and size."""
    return _load("flux2", folder, DEV_MAX_LENGTH, options)


def load_flux2_klein_adapter(folder: Path, **options: Any) -> Any:
    """The flux2-klein family loaded from ``folder`` through the registry, at this pipeline's length and size."""
    return _load("flux2-klein", folder, KLEIN_MAX_LENGTH, options)


def _load(family: str, folder: Path, max_length: int, options: dict[str, Any]) -> Any:
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    adapter = adapter_class(family).from_pipeline(PretrainedSource(str(folder), **options), resolution=RESOLUTION)
    adapter.encoder_max_length = max_length
    return adapter
