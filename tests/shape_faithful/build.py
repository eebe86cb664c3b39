"""Shape-faithful pipeline folders: the published configs of nine real checkpoints (``docs/shapes/``), built
locally with random bf16 weights, one block of each block kind, one text-encoder layer (FLUX.2: the layers its
pipelines read) and tokenizers trained here.

The builder applies the only shrinks (``docs/shapes/SOURCES.md``): transformer ``num_layers`` /
``num_single_layers`` to 1 (Z-Image's ``n_layers`` / ``n_refiner_layers`` too; SD3.5-Medium's
``dual_attention_layers`` keep block 0), text-encoder layer
counts to 1 (Qwen2.5-VL's vision tower too), ``vocab_size`` to the local tokenizer's, and the special-token
ids a text-encoder config names to the same tokens' ids in that tokenizer. FLUX.2's pipelines read hidden
states of deep text-encoder layers (dev: 10, 20, 30; klein: 9, 18, 27): their encoders keep that many layers,
each with one attention head and a 128-wide MLP, at the published hidden size. A checkpoint whose component
configs equal another's (FLUX.1-Kontext-dev: FLUX.1-dev's) keeps only its ``model_index.json`` and links the other
folder's components (``linked_folder``). Nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tiny_flux2_pipeline import mistral_tokenizer
from tiny_qwen_image_pipeline import qwen_tokenizer
from tiny_sd3_pipeline import clip_tokenizer, t5_tokenizer
from tiny_z_image_pipeline import z_image_tokenizer

CONFIGS = Path(__file__).resolve().parents[2] / "docs" / "shapes"
DTYPE = torch.bfloat16  # what the published checkpoints are run in
CLIP_LENGTH = 77  # the CLIP tokenizers' model_max_length (max_position_embeddings)
T5_LENGTH = 512  # the T5 / UMT5 tokenizers' model_max_length


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint: its hub repository, the flowpost family that trains it, its transformer width."""

    hub_id: str
    family: str
    width: int
    init_dtype: torch.dtype = torch.float32  # the dtype its random transformer is drawn in before the cast to bf16
    configs_of: str | None = None  # the checkpoint whose published component configs (and built components) it shares


CHECKPOINTS: dict[str, Checkpoint] = {
    "sd3.5-medium": Checkpoint("stabilityai/stable-diffusion-3.5-medium", "sd3", 1536),
    "flux1-dev": Checkpoint("black-forest-labs/FLUX.1-dev", "flux1", 3072),
    "flux1-kontext-dev": Checkpoint(
        "black-forest-labs/FLUX.1-Kontext-dev", "flux1-kontext", 3072, configs_of="flux1-dev"
    ),
    "qwen-image": Checkpoint("Qwen/Qwen-Image", "qwen-image", 3072),
    "wan2.1-t2v-1.3b": Checkpoint("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan2", 1536),
    "wan2.2-ti2v-5b": Checkpoint("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "wan2", 3072),
    "wan2.2-t2v-a14b": Checkpoint("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "wan22-a14b", 5120),
    "z-image-turbo": Checkpoint("Tongyi-MAI/Z-Image-Turbo", "z-image", 3840),
    # 2.2 B parameters with one block of each kind: drawn in fp32 they would take 9 GB before the cast
    "flux2-dev": Checkpoint("black-forest-labs/FLUX.2-dev", "flux2", 6144, torch.bfloat16),
    "flux2-klein-base-4b": Checkpoint("black-forest-labs/FLUX.2-klein-base-4B", "flux2-klein", 3072),
}
READ_LAYERS = {"flux2": 30, "flux2-klein": 27}  # the deepest text-encoder layer each FLUX.2 pipeline reads
SPECIAL_TOKENS: dict[str, dict[str, str]] = {  # per text-encoder model_type: the token each id field names
    "clip_text_model": {
        "bos_token_id": "<|startoftext|>",
        "eos_token_id": "<|endoftext|>",
        "pad_token_id": "<|endoftext|>",
    },
    "qwen2_5_vl": {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>"},
    "qwen3": {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>"},
    "mistral": {"bos_token_id": "<s>", "eos_token_id": "</s>", "pad_token_id": "<pad>"},
}


def published(checkpoint: str, component: str) -> dict[str, Any]:
    """The published config of ``component`` (``model_index``, ``scheduler``, ``transformer``, ...)."""
    if component == "model_index":
        return json.loads((CONFIGS / checkpoint / "model_index.json").read_text())
    name = "scheduler_config.json" if component == "scheduler" else "config.json"
    owner = CHECKPOINTS[checkpoint].configs_of or checkpoint
    return json.loads((CONFIGS / owner / component / name).read_text())


def transformer_config(checkpoint: str, component: str = "transformer") -> dict[str, Any]:
    """The published config of transformer ``component`` (Wan2.2-A14B's ``transformer_2`` too) with one block of
    each kind."""
    config = published(checkpoint, component)
    for key in ("num_layers", "num_single_layers", "n_layers", "n_refiner_layers"):
        if key in config:
            config[key] = 1
    if "dual_attention_layers" in config:
        config["dual_attention_layers"] = [i for i in config["dual_attention_layers"] if i < 1]
    return config


def text_encoder_config(checkpoint: str, component: str, tokenizer: Any) -> dict[str, Any]:
    """The published text-encoder config with one layer (FLUX.2: the layers its pipeline reads, narrowed), the
    tokenizer's vocabulary and its special-token ids."""
    config = published(checkpoint, component)
    if "text_config" in config:  # Mistral-3: the language model nested beside a vision tower it is not fed
        vision = {**config["vision_config"], "num_hidden_layers": 1}
        return {**config, "text_config": _shrunk(checkpoint, config["text_config"], tokenizer), "vision_config": vision}
    if "vision_config" in config:
        config["vision_config"] = {**config["vision_config"], "depth": 1}
    return _shrunk(checkpoint, config, tokenizer)


def _shrunk(checkpoint: str, config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """A language model's config with the shrinks above applied."""
    config = dict(config)
    layers = READ_LAYERS.get(CHECKPOINTS[checkpoint].family)
    for key in ("num_hidden_layers", "num_layers", "num_decoder_layers"):
        if key in config:
            config[key] = layers or 1
    if layers:
        config.update(num_attention_heads=1, num_key_value_heads=1, intermediate_size=128)
        if "max_window_layers" in config:
            config["max_window_layers"] = layers
    config["vocab_size"] = len(tokenizer)
    for key, token in SPECIAL_TOKENS.get(config["model_type"], {}).items():
        config[key] = tokenizer.convert_tokens_to_ids(token)
    return config


def tokenizers(checkpoint: str) -> dict[str, Any]:
    """The pipeline's tokenizers, trained here on a small corpus, at the published maximum lengths."""
    family = CHECKPOINTS[checkpoint].family
    if family == "qwen-image":
        return {"tokenizer": qwen_tokenizer()}
    if family in ("z-image", "flux2-klein"):
        return {"tokenizer": z_image_tokenizer()}
    if family == "flux2":
        return {"tokenizer": mistral_tokenizer()}
    t5 = t5_tokenizer()
    t5.model_max_length = T5_LENGTH
    if family in ("wan2", "wan22-a14b"):
        return {"tokenizer": t5}
    clip = clip_tokenizer(max_length=CLIP_LENGTH)
    if family in ("flux1", "flux1-kontext"):
        return {"tokenizer": clip, "tokenizer_2": t5}
    return {"tokenizer": clip, "tokenizer_2": clip, "tokenizer_3": t5}


def _component(checkpoint: str, name: str, class_name: str, tokens: dict[str, Any]) -> Any:
    import diffusers
    import transformers

    if name.startswith("tokenizer"):
        return tokens[name]
    if name == "scheduler":
        return getattr(diffusers, class_name).from_config(published(checkpoint, "scheduler"))
    if name.startswith("text_encoder"):
        model_class = getattr(transformers, class_name)
        tokenizer = tokens[name.replace("text_encoder", "tokenizer")]
        config = model_class.config_class.from_dict(text_encoder_config(checkpoint, name, tokenizer))
        return model_class(config).eval().to(DTYPE)
    if not name.startswith("transformer"):
        return getattr(diffusers, class_name).from_config(published(checkpoint, name)).eval().to(DTYPE)
    default = torch.get_default_dtype()
    torch.set_default_dtype(CHECKPOINTS[checkpoint].init_dtype)
    try:
        return getattr(diffusers, class_name).from_config(transformer_config(checkpoint, name)).eval().to(DTYPE)
    finally:
        torch.set_default_dtype(default)


def build_folder(checkpoint: str, out: Path, *, seed: int = 0) -> Path:
    """Write the shape-faithful pipeline folder of ``checkpoint`` (a key of ``CHECKPOINTS``) to ``out``: the
    published ``model_index.json`` classes and options, bf16 weights drawn from ``seed``."""
    import diffusers

    index = published(checkpoint, "model_index")
    tokens = tokenizers(checkpoint)
    parts: dict[str, Any] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, value in index.items():
            if name.startswith("_"):
                continue
            if isinstance(value, list):  # [library, class], or [null, null] for an absent component
                parts[name] = None if value[1] is None else _component(checkpoint, name, value[1], tokens)
            else:  # a pipeline option (Wan2.2's expand_timesteps, boundary_ratio)
                parts[name] = value
        pipeline = getattr(diffusers, index["_class_name"])(**parts)
    pipeline.save_pretrained(out, safe_serialization=True)
    return out


def linked_folder(checkpoint: str, base: Path, out: Path) -> Path:
    """The pipeline folder of ``checkpoint`` made of the components of ``base`` (the built folder of the checkpoint
    it shares its configs with, ``configs_of``), linked, under its own published ``model_index.json`` classes."""
    own, shared = (
        published(checkpoint, "model_index"),
        published(CHECKPOINTS[checkpoint].configs_of or "", "model_index"),
    )
    components = {name: value for name, value in own.items() if not name.startswith("_")}
    if components != {name: value for name, value in shared.items() if not name.startswith("_")}:
        raise ValueError(f"{checkpoint}'s published components are not those of {base}")
    index = json.loads((base / "model_index.json").read_text())
    out.mkdir(parents=True)
    for name in components:
        (out / name).symlink_to(base / name, target_is_directory=True)
    (out / "model_index.json").write_text(json.dumps({**index, "_class_name": own["_class_name"]}, indent=2))
    return out
