"""A tiny random ``QwenImageEditPipeline`` or ``QwenImageEditPlusPipeline`` (a Qwen2.5-VL with a one-block vision
tower, a tokenizer trained here, a ``Qwen2VLProcessor`` that reads a 56 px view of each source) saved as a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tiny_qwen_image_pipeline import SCHEDULER, TEXT_WIDTH, TRANSFORMER
from tiny_sd3_pipeline import CORPUS

EDIT_TEMPLATE = (  # the stock edit template around the instruction
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
INSTRUCTIONS = ["make it red", "turn the cat into a dog", "add a blue car"]
MAX_LENGTH = 16
RESOLUTION = 64  # target pixels: 4x4 latents (VAE factor 16), 2x2 = 4 packed tokens
SOURCE_SIDE = 1024  # the stock pipeline conditions on a 1024 x 1024 view of a square source
SOURCE_TOKENS = (SOURCE_SIDE // 32) ** 2  # 32x32 packed source tokens
VISION_PIXELS = 56 * 56  # the processor's max_pixels: a 4x4 patch grid, 4 merged image tokens
VAE: dict[str, Any] = {  # Qwen-Image's 16 latent channels at a 16x spatial factor (Qwen-Image's is 8): a 1024 px
    "base_dim": 4,  # source gives 1024 packed tokens, not 4096
    "z_dim": 16,
    "dim_mult": [1, 1, 1, 1, 1],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True, True],
}


def edit_tokenizer() -> Any:
    """A byte-level BPE trained on the edit template around ``CORPUS`` and ``INSTRUCTIONS`` with Qwen2's
    pre-tokenization, as a ``Qwen2Tokenizer`` with the vision special tokens."""
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
    bpe.train_from_iterator([EDIT_TEMPLATE.format(text) for text in [*CORPUS, *INSTRUCTIONS]], trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


def edit_processor(tokenizer: Any) -> Any:
    """Qwen2-VL's processor (images and text) with a 56 px ceiling on the image it reads (patch 14, 2x2 merge)."""
    from transformers import Qwen2VLImageProcessor

    from flowpost.core.models.image_text_processor import image_text_processor_class

    images = Qwen2VLImageProcessor(min_pixels=VISION_PIXELS, max_pixels=VISION_PIXELS)
    return image_text_processor_class()(image_processor=images, tokenizer=tokenizer)


def edit_text_encoder(tokenizer: Any) -> Any:
    """A random two-layer Qwen2.5-VL whose one-block vision tower reads the source image."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in _VISION_IDS.items()}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4], "rope_theta": 1e6},
            "bos_token_id": None,
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": TEXT_WIDTH,
            "fullatt_block_indexes": [0],
        },
        **ids,
    )
    return Qwen2_5_VLForConditionalGeneration(config)


_VISION_IDS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def build_tiny_qwen_image_edit_pipeline(
    folder: Path, *, seed: int = 0, pipeline_class: str = "QwenImageEditPipeline"
) -> Path:
    """Assemble a random Qwen-Image-Edit pipeline (``pipeline_class``: the Edit-Plus one too; a few MB) and save it
    to ``folder``."""
    import diffusers
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    tokenizer = edit_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = getattr(diffusers, pipeline_class)(
            transformer=QwenImageTransformer2DModel(**TRANSFORMER),
            scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
            vae=AutoencoderKLQwenImage(**VAE),
            text_encoder=edit_text_encoder(tokenizer),
            tokenizer=tokenizer,
            processor=edit_processor(tokenizer),
        )
    pipeline.save_pretrained(folder)
    return folder


def load_stock_edit_pipeline(folder: Path, pipeline_class: str = "QwenImageEditPipeline") -> Any:
    """The stock ``pipeline_class`` from ``folder``, its processor loaded for images and text."""
    import diffusers

    from flowpost.core.models.image_text_processor import load_image_text_processor
    from flowpost.core.models.pretrained import PretrainedSource

    processor = load_image_text_processor(PretrainedSource(str(folder)))
    return getattr(diffusers, pipeline_class).from_pretrained(folder, processor=processor)


def seeded_edit_states(prompts: list[str], *, grid: int = 4, sources: int = 1) -> Any:
    """Seeded edit conditions without an encoder, one generator per prompt: 5 token states of ``TEXT_WIDTH``
    (the last padding in every row after the first), and ``sources`` grids of ``grid x grid`` packed source tokens
    of 64 channels flattened in ``pooled``."""
    from flowpost.core.conditions import ConditionBatch

    generators = [torch.Generator().manual_seed(sum(map(ord, prompt)) + grid) for prompt in prompts]
    states = torch.stack([torch.randn(5, TEXT_WIDTH, generator=g) for g in generators])
    mask = torch.ones(len(prompts), 5, dtype=torch.int8)
    mask[1:, -1] = 0
    source = torch.stack([torch.randn(sources * grid * grid * 64, generator=g) for g in generators])
    return ConditionBatch(states * mask.unsqueeze(-1), mask, source)


def load_qwen_image_edit_adapter(folder: Path, *, family: str = "qwen-image-edit", **options: Any) -> Any:
    """The ``family`` (qwen-image-edit, or qwen-image-edit-plus with ``sources``) loaded from ``folder`` through the
    registry, at this pipeline's length and size; ``options`` are the source's."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    family_options = {"sources": options.pop("sources")} if "sources" in options else {}
    source = PretrainedSource(str(folder), **options)
    adapter = adapter_class(family).from_pipeline(source, resolution=RESOLUTION, **family_options)
    adapter.encoder_max_length = MAX_LENGTH
    return adapter


PLUS_SOURCES = 2  # the tiny Edit-Plus stages' sources per edit


def load_qwen_image_edit_plus_adapter(folder: Path, **options: Any) -> Any:
    """The qwen-image-edit-plus family from ``folder``, reading ``PLUS_SOURCES`` sources per edit unless
    ``options`` set ``sources``."""
    return load_qwen_image_edit_adapter(folder, family="qwen-image-edit-plus", **{"sources": PLUS_SOURCES, **options})


def seeded_plus_states(prompts: list[str]) -> Any:
    """``seeded_edit_states`` of ``PLUS_SOURCES`` 4x4 source grids."""
    return seeded_edit_states(prompts, sources=PLUS_SOURCES)
