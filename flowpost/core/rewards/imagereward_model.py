"""The ImageReward network (Xu et al. 2023) on transformers' BLIP modules, and its released checkpoint.

BLIP's ViT encodes the image; BLIP's BERT text encoder reads the prompt with cross-attention to the image
tokens; an MLP of linear layers 1024, 128, 64, 16 and 1 (dropout 0.2, 0.2, 0.1, no activations: the
aesthetic predictor's layout) maps the text encoder's output at the first token to the raw reward. The
architecture is read off the checkpoint's tensor shapes; the heads are 64 wide (ViT-L/16: 16 heads of 64,
BERT-base: 12 of 64), the ViT's layer norms use eps 1e-6 and BERT's 1e-12, and both use exact GELU.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import Tensor, nn

from flowpost.core.rewards.aesthetic import aesthetic_mlp

HEAD_WIDTH = 64
VISION_LAYER_NORM_EPS = 1e-6
TEXT_LAYER_NORM_EPS = 1e-12

VISION_RENAMED = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
VISION_BLOCK = re.compile(r"blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)")
VISION_BLOCK_PARTS = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.projection",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
# in the checkpoint, but not used by the score: BLIP's contrastive projections and a buffer of position ids
UNUSED = re.compile(r"blip\.(vision_proj|text_proj)\.(weight|bias)|blip\.text_encoder\.embeddings\.position_ids")


def imagereward_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The released ``ImageReward.pt`` state dict under ``ImageRewardModel`` names.

    - ``blip.visual_encoder.*`` (BLIP's ViT) becomes ``vision_model.*``: ``cls_token``, ``pos_embed``,
      ``patch_embed.proj`` and the final ``norm`` are renamed (``VISION_RENAMED``), and in
      ``blocks.N`` the parts ``norm1``, ``norm2``, ``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2``
      become those of ``encoder.layers.N`` (``VISION_BLOCK_PARTS``; the fused qkv keeps its layout);
    - ``blip.text_encoder.*`` (BLIP's BERT) becomes ``text_encoder.*``, names unchanged;
    - ``mlp.layers.N`` becomes ``mlp.N``;
    - ``blip.vision_proj``, ``blip.text_proj`` and ``blip.text_encoder.embeddings.position_ids`` are dropped.

    Any other key raises ``KeyError`` naming it.
    """
    converted: dict[str, Tensor] = {}
    for key, value in state.items():
        if UNUSED.fullmatch(key):
            continue
        if key.startswith("blip.visual_encoder."):
            name = key.removeprefix("blip.visual_encoder.")
            if name in VISION_RENAMED:
                converted[f"vision_model.{VISION_RENAMED[name]}"] = value
            elif match := VISION_BLOCK.fullmatch(name):
                index, part, kind = match.groups()
                converted[f"vision_model.encoder.layers.{index}.{VISION_BLOCK_PARTS[part]}.{kind}"] = value
            else:
                raise KeyError(key)
        elif key.startswith("blip.text_encoder."):
            converted["text_encoder." + key.removeprefix("blip.text_encoder.")] = value
        elif key.startswith("mlp.layers."):
            converted["mlp." + key.removeprefix("mlp.layers.")] = value
        else:
            raise KeyError(key)
    return converted


def _layers(state: dict[str, Tensor], pattern: str) -> int:
    return sum(1 for key in state if re.fullmatch(pattern, key))


def _heads(width: int) -> int:
    if width % HEAD_WIDTH:
        raise ValueError(f"width {width} is not a multiple of the {HEAD_WIDTH}-wide attention heads")
    return width // HEAD_WIDTH


def blip_configs(state: dict[str, Tensor], *, pad_token_id: int) -> tuple[Any, Any]:
    """The ``BlipVisionConfig`` and ``BlipTextConfig`` a converted state dict was saved from.

    Raises ``KeyError`` for a missing tensor and ``ValueError`` for inconsistent shapes.
    """
    from transformers import BlipTextConfig, BlipVisionConfig

    vision_width = state["vision_model.embeddings.class_embedding"].shape[-1]
    patch = state["vision_model.embeddings.patch_embedding.weight"].shape[-1]
    grid = math.isqrt(state["vision_model.embeddings.position_embedding"].shape[1] - 1)
    if grid * grid + 1 != state["vision_model.embeddings.position_embedding"].shape[1]:
        raise ValueError("the ViT's position embeddings are not those of a square grid of patches")
    vision = BlipVisionConfig(
        hidden_size=vision_width,
        intermediate_size=state["vision_model.encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=_layers(state, r"vision_model\.encoder\.layers\.\d+\.layer_norm1\.weight"),
        num_attention_heads=_heads(vision_width),
        image_size=grid * patch,
        patch_size=patch,
        hidden_act="gelu",
        layer_norm_eps=VISION_LAYER_NORM_EPS,
    )
    vocab, text_width = state["text_encoder.embeddings.word_embeddings.weight"].shape
    text = BlipTextConfig(
        vocab_size=vocab,
        hidden_size=text_width,
        encoder_hidden_size=state["text_encoder.encoder.layer.0.crossattention.self.key.weight"].shape[1],
        intermediate_size=state["text_encoder.encoder.layer.0.intermediate.dense.weight"].shape[0],
        num_hidden_layers=_layers(state, r"text_encoder\.encoder\.layer\.\d+\.attention\.self\.query\.weight"),
        num_attention_heads=_heads(text_width),
        max_position_embeddings=state["text_encoder.embeddings.position_embeddings.weight"].shape[0],
        hidden_act="gelu",
        layer_norm_eps=TEXT_LAYER_NORM_EPS,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        eos_token_id=None,
        sep_token_id=None,
        is_decoder=True,  # transformers builds the cross-attention layers only for a decoder config
        use_cache=False,
    )
    return vision, text


class ImageRewardModel(nn.Module):
    """BLIP's ViT and image-grounded BERT text encoder, and the reward MLP on the text encoder's first token."""

    def __init__(self, vision_config: Any, text_config: Any) -> None:
        from transformers.models.blip.modeling_blip import BlipVisionModel
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        super().__init__()
        self.vision_model = BlipVisionModel(vision_config)
        self.text_encoder = BlipTextModel(text_config, add_pooling_layer=False)
        self.mlp = aesthetic_mlp(text_config.hidden_size)

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """[B] float32 raw rewards (before ImageReward's normalisation); the MLP runs in float32."""
        image_tokens = self.vision_model(pixel_values=pixel_values).last_hidden_state
        image_mask = torch.ones(image_tokens.shape[:-1], dtype=torch.long, device=image_tokens.device)
        text = self.text_encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_tokens,
            encoder_attention_mask=image_mask,
        ).last_hidden_state
        return self.mlp(text[:, 0].float()).squeeze(-1)
