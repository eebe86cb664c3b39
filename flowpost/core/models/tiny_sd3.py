"""The embedded tiny family: an SD3 transformer in pixel space on small single-channel images."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import read_json
from flowpost.core.models.base import ADAPTER_FILE, DEFAULT_ENCODER_MAX_LENGTH
from flowpost.core.models.sd3_transformer import SD3TransformerAdapter
from flowpost.core.models.text_state import TextState
from flowpost.core.seeding import seeded

TRANSFORMER_DEFAULTS: dict[str, Any] = {
    "sample_size": 16,
    "patch_size": 2,
    "in_channels": 1,
    "out_channels": 1,
    "num_layers": 4,
    "attention_head_dim": 32,
    "num_attention_heads": 4,
    "joint_attention_dim": 384,
    "caption_projection_dim": 128,
    "pooled_projection_dim": 384,
    "pos_embed_max_size": 8,
}


TinySD3State = TextState  # the tiny family feeds the SD3 transformer as the sd3 family does


class TinySD3Adapter(SD3TransformerAdapter):
    """``SD3Transformer2DModel`` on pixels in [-1, 1], conditioned by MiniLM embeddings."""

    family: ClassVar[str] = "tiny-sd3"
    output_codec: ClassVar[str] = "identity (pixels in [-1, 1])"

    def __init__(
        self,
        transformer: torch.nn.Module,
        *,
        shift: float = 1.0,
        encoder: str = "minilm",
        encoder_max_length: int = DEFAULT_ENCODER_MAX_LENGTH,
    ) -> None:
        super().__init__(transformer)
        self.shift = shift
        self.encoder_name = encoder
        self.encoder_max_length = encoder_max_length

    @classmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict[str, Any] | None = None) -> TinySD3Adapter:
        from diffusers import SD3Transformer2DModel

        config = {**TRANSFORMER_DEFAULTS, **(overrides or {})}
        with seeded(seed):
            transformer = SD3Transformer2DModel(**config)
        return cls(transformer, shift=shift)

    @classmethod
    def scratch_channels(cls, overrides: dict[str, Any] | None = None) -> int | None:
        return int({**TRANSFORMER_DEFAULTS, **(overrides or {})}["in_channels"])

    @classmethod
    def from_pretrained(cls, path: str | Path) -> TinySD3Adapter:
        from diffusers import SD3Transformer2DModel

        path = Path(path)
        meta = read_json(path / ADAPTER_FILE, what="model adapter manifest")
        transformer = SD3Transformer2DModel.from_pretrained(path / "transformer")
        return cls(
            transformer,
            shift=float(meta["schedule"]["shift"]),
            encoder=meta["encoder"],
            encoder_max_length=int(meta.get("encoder_max_length", DEFAULT_ENCODER_MAX_LENGTH)),
        )

    def prepare_condition_state(self, batch: ConditionBatch) -> TinySD3State:
        mask = batch.token_mask.to(batch.token_states.dtype).unsqueeze(-1)
        return TinySD3State(batch.token_states * mask, batch.pooled)

    def encode_output_state(self, media: Tensor) -> Tensor:
        return media * 2.0 - 1.0

    def decode(self, latents: Tensor) -> Tensor:
        return ((latents.float() + 1.0) / 2.0).clamp(0.0, 1.0)
