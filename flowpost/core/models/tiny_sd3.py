"""The embedded tiny family: an SD3 transformer in pixel space on small single-channel images."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE, DEFAULT_ENCODER_MAX_LENGTH, ModelAdapter
from flowpost.core.models.lora import SD3_ATTENTION_TARGETS, add_lora, has_lora, merged_copy
from flowpost.core.roles import Snapshots
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


@dataclass
class TinySD3State(ConditionState):
    """Token states and pooled vector as the SD3 transformer consumes them."""

    encoder_hidden_states: Tensor
    pooled_projections: Tensor

    def __len__(self) -> int:
        return int(self.encoder_hidden_states.shape[0])

    def index(self, rows: Tensor | list[int]) -> Self:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        return type(self)(self.encoder_hidden_states[rows_t], self.pooled_projections[rows_t])

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        return cls(
            torch.cat([s.encoder_hidden_states for s in states]),
            torch.cat([s.pooled_projections for s in states]),
        )


class TinySD3Adapter(ModelAdapter):
    """``SD3Transformer2DModel`` on pixels in [-1, 1], conditioned by MiniLM embeddings."""

    family: ClassVar[str] = "tiny-sd3"

    def __init__(
        self,
        transformer: torch.nn.Module,
        *,
        shift: float = 1.0,
        encoder: str = "minilm",
        encoder_max_length: int = DEFAULT_ENCODER_MAX_LENGTH,
    ) -> None:
        self.transformer = transformer
        self.shift = shift
        self.encoder_name = encoder
        self.encoder_max_length = encoder_max_length
        self.snapshots = Snapshots()
        self.lora: dict[str, Any] | None = None

    @classmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict[str, Any] | None = None) -> TinySD3Adapter:
        from diffusers import SD3Transformer2DModel

        config = {**TRANSFORMER_DEFAULTS, **(overrides or {})}
        with seeded(seed):
            transformer = SD3Transformer2DModel(**config)
        return cls(transformer, shift=shift)

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

    def add_lora(self, *, rank: int, alpha: float, targets: list[str] | None = None) -> None:
        add_lora(self.transformer, rank=rank, alpha=alpha, targets=targets or SD3_ATTENTION_TARGETS)
        self.lora = {"rank": rank, "alpha": alpha, "targets": list(targets or SD3_ATTENTION_TARGETS)}

    def save_pretrained(self, path: str | Path) -> None:
        """LoRA, when present, is merged: the folder is a plain diffusers transformer."""
        path = Path(path)
        network = merged_copy(self.transformer) if has_lora(self.transformer) else self.transformer
        network.save_pretrained(path / "transformer", safe_serialization=True)
        write_json_atomic(path / ADAPTER_FILE, self.describe())

    def describe(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "encoder": self.encoder_name,
            "encoder_max_length": self.encoder_max_length,
            "output_codec": "identity (pixels in [-1, 1])",
            "schedule": {
                "kind": "flow-matching",
                "shift": self.shift,
                "prediction": "velocity (noise - x0)",
            },
            "latent_shape": list(self.latent_shape),
            "trained_with_lora": self.lora,
        }

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        config = self.transformer.config
        return (config.in_channels, config.sample_size, config.sample_size)

    def module(self) -> torch.nn.Module:
        return self.transformer

    def prepare_condition_state(self, batch: ConditionBatch) -> TinySD3State:
        mask = batch.token_mask.to(batch.token_states.dtype).unsqueeze(-1)
        return TinySD3State(batch.token_states * mask, batch.pooled)

    def encode_output_state(self, media: Tensor) -> Tensor:
        return media * 2.0 - 1.0

    def decode(self, latents: Tensor) -> Tensor:
        return ((latents.float() + 1.0) / 2.0).clamp(0.0, 1.0)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        assert isinstance(state, TinySD3State)
        sigma = torch.as_tensor(sigma, dtype=latents.dtype, device=latents.device).expand(latents.shape[0])
        return self.transformer(
            hidden_states=latents,
            encoder_hidden_states=state.encoder_hidden_states.to(latents.dtype),
            pooled_projections=state.pooled_projections.to(latents.dtype),
            timestep=sigma * 1000.0,
            return_dict=False,
        )[0]

    @contextlib.contextmanager
    def use_snapshot(self, name: str) -> Iterator[TinySD3Adapter]:
        with self.snapshots.swapped_in(name, self.transformer):
            yield self
