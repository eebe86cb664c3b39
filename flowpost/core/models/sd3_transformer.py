"""What the families built on ``SD3Transformer2DModel`` share (sd3, tiny-sd3): condition state,
velocity call, LoRA, snapshots and the transformer export."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.io import write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE, LORA_BASE_DIR, LORA_DIR, ModelAdapter
from flowpost.core.models.lora import SD3_ATTENTION_TARGETS, add_lora, base_copy, has_lora, merged_copy, save_lora
from flowpost.core.roles import Snapshots


@dataclass
class SD3State(ConditionState):
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


class SD3TransformerAdapter(ModelAdapter):
    """An ``SD3Transformer2DModel`` as the trainable network; subclasses add conditions and the output codec."""

    output_codec: ClassVar[str]
    transformer_is_pipelines: bool = False  # the transformer is the source pipeline's own, untrained

    def __init__(self, transformer: torch.nn.Module) -> None:
        self.transformer = transformer
        self.snapshots = Snapshots()
        self.lora: dict[str, Any] | None = None

    def add_lora(self, *, rank: int, alpha: float, targets: list[str] | None = None) -> None:
        """Adapters on the current weights; ``lora["base"]`` says where an export finds those weights."""
        add_lora(self.transformer, rank=rank, alpha=alpha, targets=targets or SD3_ATTENTION_TARGETS)
        base = "pretrained" if self.transformer_is_pipelines else f"{LORA_BASE_DIR}/transformer"
        self.lora = {"rank": rank, "alpha": alpha, "targets": list(targets or SD3_ATTENTION_TARGETS), "base": base}

    def save_pretrained(self, path: str | Path) -> None:
        """LoRA, when present, is merged: ``transformer/`` is a plain diffusers transformer; ``lora/`` holds
        the adapters alone in diffusers' LoRA format, and ``lora_base/transformer/`` the weights they sit on
        unless those are the pretrained pipeline's."""
        path = Path(path)
        network = self.transformer
        if has_lora(self.transformer):
            save_lora(self.transformer, path / LORA_DIR)
            if not self.transformer_is_pipelines:
                base_copy(self.transformer).save_pretrained(
                    path / LORA_BASE_DIR / "transformer", safe_serialization=True
                )
            network = merged_copy(self.transformer)
        network.save_pretrained(path / "transformer", safe_serialization=True)
        write_json_atomic(path / ADAPTER_FILE, self.describe())

    def describe(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "encoder": self.encoder_name,
            "encoder_max_length": self.encoder_max_length,
            "output_codec": self.output_codec,
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

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep = sigma * 1000``, as the stock pipeline calls it, in the latents' dtype."""
        assert isinstance(state, SD3State)
        sigma = torch.as_tensor(sigma, dtype=latents.dtype, device=latents.device).expand(latents.shape[0])
        return self.transformer(
            hidden_states=latents,
            encoder_hidden_states=state.encoder_hidden_states.to(device=latents.device, dtype=latents.dtype),
            pooled_projections=state.pooled_projections.to(device=latents.device, dtype=latents.dtype),
            timestep=sigma * 1000.0,
            return_dict=False,
        )[0]

    @contextlib.contextmanager
    def use_snapshot(self, name: str) -> Iterator[Self]:
        with self.snapshots.swapped_in(name, self.transformer):
            yield self
