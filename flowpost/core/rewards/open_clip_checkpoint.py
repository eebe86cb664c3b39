"""open_clip CLIP checkpoints (HPS v2 is one) as transformers ``CLIPModel``s: the architecture and the weights.

An architecture is an open_clip model config: a built-in name (``ViT-H-14``) or a JSON file in open_clip's
format (``embed_dim``, ``vision_cfg``, ``text_cfg``, ``quick_gelu``). Only plain ViT towers with open_clip's
own text transformer are supported; any other config key is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from flowpost.errors import FlowpostError

# open_clip's model_configs/ViT-H-14.json: the architecture of HPS v2 and v2.1
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "ViT-H-14": {
        "embed_dim": 1024,
        "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24},
    }
}
VISION_DEFAULTS = {"head_width": 64, "mlp_ratio": 4.0}  # open_clip's CLIPVisionCfg defaults
TEXT_DEFAULTS = {"heads": 8, "mlp_ratio": 4.0}  # open_clip's CLIPTextCfg defaults
VISION_KEYS = {"image_size", "layers", "width", "patch_size", *VISION_DEFAULTS}
TEXT_KEYS = {"context_length", "vocab_size", "width", "layers", *TEXT_DEFAULTS}

# open_clip name -> transformers CLIPModel name, for the tensors outside the transformer blocks
RENAMED = {
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
}
# open_clip keeps the projections as [width, embed_dim] matrices applied on the right; transformers as Linear
TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}
BLOCK = re.compile(r"(visual\.)?transformer\.resblocks\.(\d+)\.(.+)")
BLOCK_PARTS = {
    "ln_1": "layer_norm1",
    "ln_2": "layer_norm2",
    "attn.out_proj": "self_attn.out_proj",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
}


@dataclass(frozen=True)
class OpenClipArchitecture:
    """The sizes of an open_clip ViT CLIP model."""

    embed_dim: int
    image_size: int
    patch_size: int
    vision_width: int
    vision_layers: int
    vision_heads: int
    vision_mlp: int
    context_length: int
    vocab_size: int
    text_width: int
    text_layers: int
    text_heads: int
    text_mlp: int
    quick_gelu: bool


def _config(model: str) -> dict[str, Any]:
    if model in ARCHITECTURES:
        return ARCHITECTURES[model]
    path = Path(model).expanduser()
    if not path.is_file():
        raise FlowpostError(
            f"{model!r} is neither a known architecture ({', '.join(ARCHITECTURES)}) nor an open_clip model "
            "config file",
            where="options.model",
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FlowpostError(f"cannot read {str(path)!r} as JSON ({exc})", where="options.model") from None
    if not isinstance(config, dict):
        raise FlowpostError(f"{str(path)!r} does not hold an open_clip model config", where="options.model")
    return config


def open_clip_architecture(model: str) -> OpenClipArchitecture:
    """The architecture ``model`` names: a built-in name or the path of an open_clip model config file."""
    if not isinstance(model, str | Path):
        raise FlowpostError(f"model must be an architecture name or a file, got {model!r}", where="options.model")
    config = _config(str(model))
    vision, text = config.get("vision_cfg"), config.get("text_cfg")
    if not isinstance(vision, dict) or not isinstance(text, dict) or "embed_dim" not in config:
        raise FlowpostError("an open_clip model config needs embed_dim, vision_cfg and text_cfg", where="options.model")
    unsupported = sorted(
        [key for key in config if key not in {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu"}]
        + [f"vision_cfg.{key}" for key in vision if key not in VISION_KEYS]
        + [f"text_cfg.{key}" for key in text if key not in TEXT_KEYS]
    )
    if unsupported:
        raise FlowpostError(
            f"unsupported open_clip config keys {unsupported}: only ViT towers with open_clip's text transformer",
            where="options.model",
        )
    vision, text = {**VISION_DEFAULTS, **vision}, {**TEXT_DEFAULTS, **text}
    try:
        return OpenClipArchitecture(
            embed_dim=int(config["embed_dim"]),
            image_size=int(vision["image_size"]),
            patch_size=int(vision["patch_size"]),
            vision_width=int(vision["width"]),
            vision_layers=int(vision["layers"]),
            vision_heads=int(vision["width"]) // int(vision["head_width"]),
            vision_mlp=int(int(vision["width"]) * float(vision["mlp_ratio"])),
            context_length=int(text["context_length"]),
            vocab_size=int(text["vocab_size"]),
            text_width=int(text["width"]),
            text_layers=int(text["layers"]),
            text_heads=int(text["heads"]),
            text_mlp=int(int(text["width"]) * float(text["mlp_ratio"])),
            quick_gelu=bool(config.get("quick_gelu", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FlowpostError(f"incomplete open_clip model config ({exc!r})", where="options.model") from None


def clip_config(architecture: OpenClipArchitecture, special_tokens: dict[str, int]) -> Any:
    """The transformers ``CLIPConfig`` of the same network (GELU, or QuickGELU where open_clip says so);
    ``special_tokens`` are the tokenizer's ``bos_token_id``, ``eos_token_id`` and ``pad_token_id``."""
    from transformers import CLIPConfig

    act = "quick_gelu" if architecture.quick_gelu else "gelu"
    vision = {
        "hidden_size": architecture.vision_width,
        "intermediate_size": architecture.vision_mlp,
        "num_hidden_layers": architecture.vision_layers,
        "num_attention_heads": architecture.vision_heads,
        "image_size": architecture.image_size,
        "patch_size": architecture.patch_size,
        "hidden_act": act,
    }
    text = {
        "vocab_size": architecture.vocab_size,
        "hidden_size": architecture.text_width,
        "intermediate_size": architecture.text_mlp,
        "num_hidden_layers": architecture.text_layers,
        "num_attention_heads": architecture.text_heads,
        "max_position_embeddings": architecture.context_length,
        "hidden_act": act,
        **special_tokens,
    }
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=architecture.embed_dim)


def clip_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """An open_clip CLIP state dict under transformers ``CLIPModel`` names.

    - ``visual.conv1``, ``visual.class_embedding``, ``visual.positional_embedding``, ``visual.ln_pre``,
      ``visual.ln_post``, ``token_embedding``, ``positional_embedding``, ``ln_final`` and ``logit_scale``
      are renamed (``RENAMED``);
    - ``visual.proj`` and ``text_projection`` ([width, embed_dim]) become the transposed weights of
      ``visual_projection`` and ``text_projection``;
    - in the blocks ``[visual.]transformer.resblocks.N``, the fused ``attn.in_proj_weight``/``in_proj_bias``
      are split, in order, into ``self_attn.q_proj``, ``k_proj`` and ``v_proj``, and ``ln_1``, ``ln_2``,
      ``attn.out_proj``, ``mlp.c_fc``, ``mlp.c_proj`` are renamed (``BLOCK_PARTS``) under
      ``{vision,text}_model.encoder.layers.N``.

    Any other key raises ``KeyError`` naming it.
    """
    converted: dict[str, Tensor] = {}
    for key, value in state.items():
        if key in RENAMED:
            converted[RENAMED[key]] = value
        elif key in TRANSPOSED:
            converted[TRANSPOSED[key]] = value.T.contiguous()
        elif match := BLOCK.fullmatch(key):
            visual, index, part = match.groups()
            prefix = f"{'vision' if visual else 'text'}_model.encoder.layers.{index}."
            if part in ("attn.in_proj_weight", "attn.in_proj_bias"):
                kind = part.rsplit("_", 1)[-1]
                for name, chunk in zip(("q", "k", "v"), value.chunk(3, dim=0), strict=True):
                    converted[f"{prefix}self_attn.{name}_proj.{kind}"] = chunk.contiguous()
            elif (base := part.rsplit(".", 1)[0]) in BLOCK_PARTS:
                converted[prefix + BLOCK_PARTS[base] + part[len(base) :]] = value
            else:
                raise KeyError(key)
        else:
            raise KeyError(key)
    return converted
