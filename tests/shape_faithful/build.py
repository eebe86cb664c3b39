"""Shape-faithful pipeline folders: the published configs of twelve real checkpoints (``docs/shapes/``), built
locally with random bf16 weights, one block of each block kind, one text-encoder layer (FLUX.2: the layers its
pipelines read) and tokenizers trained here; a checkpoint that ``shares`` another's components links them.

The builder applies the only shrinks (``docs/shapes/SOURCES.md``): transformer ``num_layers`` /
``num_single_layers`` to 1 (Z-Image's ``n_layers`` / ``n_refiner_layers`` too; SD3.5-Medium's
``dual_attention_layers`` keep block 0), text-encoder layer
counts to 1 (Qwen2.5-VL's vision tower too), ``vocab_size`` to the local tokenizer's, and the special-token
ids a text-encoder config names to the same tokens' ids in that tokenizer. FLUX.2's pipelines read hidden
states of deep text-encoder layers (dev: 10, 20, 30; klein: 9, 18, 27): their encoders keep that many layers,
each with one attention head and a 128-wide MLP, at the published hidden size. Nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tiny_flux2_pipeline import mistral_tokenizer
from tiny_qwen_image_edit_pipeline import edit_tokenizer
from tiny_qwen_image_pipeline import qwen_tokenizer
from tiny_sd3_pipeline import clip_tokenizer, t5_tokenizer
from tiny_z_image_pipeline import z_image_tokenizer

from flowpost.core.conditions import ConditionBatch

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
    shares: str | None = None  # a checkpoint whose built components it links where the published configs agree


CHECKPOINTS: dict[str, Checkpoint] = {
    "sd3.5-medium": Checkpoint("stabilityai/stable-diffusion-3.5-medium", "sd3", 1536),
    "flux1-dev": Checkpoint("black-forest-labs/FLUX.1-dev", "flux1", 3072),
    "flux1-kontext-dev": Checkpoint("black-forest-labs/FLUX.1-Kontext-dev", "flux1-kontext", 3072, shares="flux1-dev"),
    "qwen-image": Checkpoint("Qwen/Qwen-Image", "qwen-image", 3072),
    "wan2.1-t2v-1.3b": Checkpoint("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan2", 1536),
    "wan2.2-ti2v-5b": Checkpoint("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "wan2", 3072),
    "wan2.2-t2v-a14b": Checkpoint("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "wan22-a14b", 5120),
    "z-image-turbo": Checkpoint("Tongyi-MAI/Z-Image-Turbo", "z-image", 3840),
    # 2.2 B parameters with one block of each kind: drawn in fp32 they would take 9 GB before the cast
    "flux2-dev": Checkpoint("black-forest-labs/FLUX.2-dev", "flux2", 6144, torch.bfloat16),
    "flux2-klein-base-4b": Checkpoint("black-forest-labs/FLUX.2-klein-base-4B", "flux2-klein", 3072),
    "qwen-image-edit": Checkpoint("Qwen/Qwen-Image-Edit", "qwen-image-edit", 3072, shares="qwen-image"),
    "qwen-image-edit-2509": Checkpoint("Qwen/Qwen-Image-Edit-2509", "qwen-image-edit-plus", 3072, shares="qwen-image"),
}
# components (text_encoder_2 ... too) built around the local tokenizers: never shared
TOKENIZED = ("text_encoder", "tokenizer", "processor")
VISION_TOKENS = {  # Qwen2.5-VL's vision token ids, set to the local tokenizer's where it has them (the edit ones)
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
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
    name = {"scheduler": "scheduler_config.json", "processor": "preprocessor_config.json"}.get(component, "config.json")
    return json.loads((CONFIGS / checkpoint / component / name).read_text())


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
    if "<|image_pad|>" in tokenizer.get_vocab():
        config.update({key: tokenizer.convert_tokens_to_ids(token) for key, token in VISION_TOKENS.items()})
    return config


def tokenizers(checkpoint: str) -> dict[str, Any]:
    """The pipeline's tokenizers, trained here on a small corpus, at the published maximum lengths."""
    family = CHECKPOINTS[checkpoint].family
    if family == "qwen-image":
        return {"tokenizer": qwen_tokenizer()}
    if family in ("qwen-image-edit", "qwen-image-edit-plus"):
        return {"tokenizer": edit_tokenizer()}
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
    if name == "processor":  # Qwen2-VL's, over the local tokenizer (image_text_processor.py: no video part)
        from flowpost.core.models.image_text_processor import image_text_processor_class

        config = {k: v for k, v in published(checkpoint, name).items() if not k.endswith(("_type", "_class"))}
        images = transformers.Qwen2VLImageProcessor(**config)
        return image_text_processor_class()(image_processor=images, tokenizer=tokens["tokenizer"])
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


def shared_components(checkpoint: str) -> list[str]:
    """The components ``checkpoint`` takes from the folder of the checkpoint it ``shares``: those of the same class
    and the same published config that no local tokenizer shapes."""
    other = CHECKPOINTS[checkpoint].shares
    if other is None:
        return []
    index, theirs = published(checkpoint, "model_index"), published(other, "model_index")
    return [
        name
        for name, value in index.items()
        if isinstance(value, list)
        and not name.startswith(TOKENIZED)
        and theirs.get(name) == value
        and published(checkpoint, name) == published(other, name)
    ]


def build_folder(checkpoint: str, out: Path, *, seed: int = 0, shared: Path | None = None) -> Path:
    """Write the shape-faithful pipeline folder of ``checkpoint`` (a key of ``CHECKPOINTS``) to ``out``: the
    published ``model_index.json`` classes and options, bf16 weights drawn from ``seed``. With ``shared`` (the
    built folder of the checkpoint it ``shares``), the ``shared_components`` are links into that folder."""
    import diffusers

    index = published(checkpoint, "model_index")
    tokens = tokenizers(checkpoint)
    linked = shared_components(checkpoint) if shared is not None else []
    parts: dict[str, Any] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, value in index.items():
            if name.startswith("_"):
                continue
            if name in linked:
                parts[name] = getattr(diffusers, value[1]).from_pretrained(shared / name)
            elif isinstance(value, list):  # [library, class], or [null, null] for an absent component
                parts[name] = None if value[1] is None else _component(checkpoint, name, value[1], tokens)
            else:  # a pipeline option (Wan2.2's expand_timesteps, boundary_ratio)
                parts[name] = value
        pipeline = getattr(diffusers, index["_class_name"])(**parts)
    if not linked:
        pipeline.save_pretrained(out, safe_serialization=True)
        return out
    for name in index:
        if name in linked:
            out.mkdir(parents=True, exist_ok=True)
            (out / name).symlink_to(shared / name, target_is_directory=True)
        elif not name.startswith("_") and parts[name] is not None and hasattr(parts[name], "save_pretrained"):
            parts[name].save_pretrained(out / name)
    pipeline.save_config(out)  # model_index.json, as save_pretrained writes it
    return out


def is_edit(checkpoint: str) -> bool:
    """Whether the checkpoint's family edits source images (an ``EditAdapter``)."""
    from flowpost.core.models.edit_family import EditAdapter
    from flowpost.core.models.registry import adapter_class

    return issubclass(adapter_class(CHECKPOINTS[checkpoint].family), EditAdapter)


def seeded_edit_conditions(
    checkpoint: str, prompts: list[str], *, grid: int = 4, text_tokens: int = 6
) -> ConditionBatch:
    """Edit conditions of ``prompts`` at the checkpoint's published widths, drawn from one generator per prompt:
    ``text_tokens`` token states as wide as its text encoder and ``grid x grid`` packed source tokens as wide as its
    transformer's input, flattened in ``pooled`` (FLUX.1-Kontext: T5's states, unmasked, and a pooled CLIP vector
    before the source; Qwen-Image-Edit: Qwen2.5-VL's, the last one padding after the first row).

    The stock pipelines read every source at 1024 x 1024 pixels: at the published VAE width one encode takes
    minutes on a CPU and a 64 x 64 grid of source tokens makes every transformer pass seconds long, so the
    training rows take seeded conditions on a small grid; the stock pipeline's own row encodes a real source."""
    index, transformer = published(checkpoint, "model_index"), published(checkpoint, "transformer")
    channels = transformer["in_channels"]
    generators = [torch.Generator().manual_seed(sum(map(ord, prompt))) for prompt in prompts]
    if "text_encoder_2" in index:  # FLUX.1-Kontext: CLIP's pooled vector, then the source, in ``pooled``
        width, pooled = published(checkpoint, "text_encoder_2")["d_model"], transformer["pooled_projection_dim"]
        states = torch.stack([torch.randn(text_tokens, width, generator=g) for g in generators])
        values = torch.stack([torch.randn(pooled + grid * grid * channels, generator=g) for g in generators])
        return ConditionBatch(states, torch.ones(len(prompts), text_tokens, dtype=torch.int8), values)
    width = published(checkpoint, "text_encoder")["hidden_size"]
    states = torch.stack([torch.randn(text_tokens, width, generator=g) for g in generators])
    mask = torch.ones(len(prompts), text_tokens, dtype=torch.int8)
    mask[1:, -1] = 0
    source = torch.stack([torch.randn(grid * grid * channels, generator=g) for g in generators])
    return ConditionBatch(states * mask.unsqueeze(-1), mask, source)


def stock_pipeline(checkpoint: str, folder: Path, **components: Any) -> Any:
    """The published pipeline class loaded from ``folder`` in bf16 (an edit pipeline's processor for images and
    text: ``image_text_processor.py``)."""
    import diffusers

    from flowpost.core.models.image_text_processor import PROCESSOR, load_image_text_processor
    from flowpost.core.models.pretrained import PretrainedSource

    if PROCESSOR in published(checkpoint, "model_index"):
        components.setdefault(PROCESSOR, load_image_text_processor(PretrainedSource(str(folder))))
    pipeline_class = getattr(diffusers, published(checkpoint, "model_index")["_class_name"])
    return pipeline_class.from_pretrained(folder, torch_dtype=DTYPE, **components)
