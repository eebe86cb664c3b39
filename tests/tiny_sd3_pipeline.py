"""A tiny random ``StableDiffusion3Pipeline`` built locally (tokenizers trained here) and saved as a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CORPUS = [f"a photo of a {colour} {thing}" for colour in ("red", "green", "blue") for thing in ("cat", "dog", "car")]
CLIP_LENGTH = 16  # tokenizer.model_max_length: the CLIP token count the pipeline pads to
T5_LENGTH = 16  # max_sequence_length given to the pipeline and the adapter
CLIP_L, CLIP_G, T5_WIDTH = 32, 48, 96  # CLIP-L + CLIP-G token widths pad to the T5 width, as in SD3
TRANSFORMER: dict[str, Any] = {
    "sample_size": 8,
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": T5_WIDTH,
    "caption_projection_dim": 16,
    "pooled_projection_dim": CLIP_L + CLIP_G,
    "pos_embed_max_size": 8,
    "qk_norm": "rms_norm",  # SD3.5
    "dual_attention_layers": (0,),  # SD3.5-Medium's MMDiT-X blocks
}
VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "block_out_channels": (8, 16),  # 2x downsampling: 16x16 images for 8x8 latents
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "shift_factor": 0.0609,
    "scaling_factor": 1.5305,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}


def clip_tokenizer(max_length: int = CLIP_LENGTH) -> Any:
    """A byte-level BPE trained on ``CORPUS`` with CLIP's pre-tokenization, as a ``CLIPTokenizer`` padding
    to ``max_length`` tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    specials = ["<|startoftext|>", "<|endoftext|>"]
    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        end_of_word_suffix="</w>",
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return CLIPTokenizer(vocab=model["vocab"], merges=merges, model_max_length=max_length)


def t5_tokenizer() -> Any:
    """A Unigram model trained on ``CORPUS`` (pad, eos, unk first, as T5's), as a ``T5TokenizerFast``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import T5TokenizerFast

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    unigram.train_from_iterator(CORPUS, trainer)
    vocab = [(piece, float(score)) for piece, score in json.loads(unigram.to_str())["model"]["vocab"]]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=T5_LENGTH)


def clip_encoder(width: int, vocab_size: int, *, projection: bool = True, max_length: int = CLIP_LENGTH) -> Any:
    """A random CLIP text encoder; ``projection``: with SD3's text projection, else FLUX's plain one."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        projection_dim=width,
        intermediate_size=2 * width,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=max_length,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def t5_encoder(vocab_size: int, width: int = T5_WIDTH) -> Any:
    """A random T5 encoder whose token states are ``width`` wide."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=vocab_size,
        d_model=width,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
    )
    return T5EncoderModel(config)


def build_tiny_sd3_pipeline(folder: Path, *, seed: int = 0) -> Path:
    """Assemble a random SD3 pipeline (SD3.5-Medium-shaped, about 1 MB) and save it to ``folder``."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    tokenizer, tokenizer_3 = clip_tokenizer(), t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipeline = StableDiffusion3Pipeline(
            transformer=SD3Transformer2DModel(**TRANSFORMER),
            scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            vae=AutoencoderKL(**VAE),
            text_encoder=clip_encoder(CLIP_L, len(tokenizer)),
            tokenizer=tokenizer,
            text_encoder_2=clip_encoder(CLIP_G, len(tokenizer)),
            tokenizer_2=tokenizer,
            text_encoder_3=t5_encoder(len(tokenizer_3)),
            tokenizer_3=tokenizer_3,
        )
    pipeline.save_pretrained(folder)
    return folder


def load_sd3_adapter(folder: Path, **options: Any) -> Any:
    """The sd3 family loaded from ``folder`` through the registry, encoding at this pipeline's T5 length."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    adapter = adapter_class("sd3").from_pipeline(PretrainedSource(str(folder), **options))
    adapter.encoder_max_length = T5_LENGTH
    return adapter
