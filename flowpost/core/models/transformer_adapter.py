"""What every family built on one diffusers transformer shares: snapshots, LoRA, gradient
checkpointing, the manifest and the transformer and LoRA exports."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from flowpost.core.io import write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE, LORA_BASE_DIR, LORA_DIR, ModelAdapter
from flowpost.core.models.block_checkpointing import BlockCheckpointing, set_block_checkpointing
from flowpost.core.models.lora import SD3_ATTENTION_TARGETS, add_lora, base_copy, has_lora, merged_copy, save_lora
from flowpost.core.roles import ComponentVariants, RoleAdapters, Snapshots


class TransformerAdapter(ModelAdapter):
    """A diffusers transformer as the trainable network; subclasses add conditions, latents and the velocity call."""

    output_codec: ClassVar[str]
    lora_targets: ClassVar[tuple[str, ...]] = SD3_ATTENTION_TARGETS  # the MMDiT attention projections
    pipeline_class: ClassVar[str] = "StableDiffusion3Pipeline"  # the transformer's stock pipeline: writes ``lora/``
    transformer_is_pipelines: bool = False  # the transformer is the source pipeline's own, untrained

    def __init__(self, transformer: torch.nn.Module) -> None:
        self.transformer = transformer
        self.snapshots = Snapshots()
        self.variants: ComponentVariants | None = None
        self.lora: dict[str, Any] | None = None

    def add_component_variants(self, roles: Sequence[str]) -> None:
        """One live variant of the transformer per role, before the parallel layout prepares it: with
        LoRA one adapter per role on the shared base, else a full copy per role (the first role's is
        the transformer itself), compiled like the transformer when it is."""
        kind = RoleAdapters if has_lora(self.transformer) else ComponentVariants
        self.variants = kind(self.transformer, roles)
        if self.compile_settings is not None:  # deep copies come back uncompiled
            regional, options = self.compile_settings
            self.compile_networks(regional=regional, options=options)

    def trainable_network(self) -> torch.nn.Module:
        return self.transformer if self.variants is None else self.variants.bundle

    def role_networks(self) -> list[torch.nn.Module]:
        return [self.transformer] if self.variants is None else self.variants.networks()

    @contextlib.contextmanager
    def use_component_variant(self, role: str) -> Iterator[Self]:
        if self.variants is None:
            raise KeyError(f"{role!r}: this model declares no trainable roles")
        network = self.transformer
        with self.variants.activated(role) as self.transformer:
            try:
                yield self
            finally:
                self.transformer = network

    def add_lora(self, *, rank: int, alpha: float, targets: list[str] | None = None) -> None:
        """Adapters on the current weights; ``lora["base"]`` says where an export finds those weights."""
        add_lora(self.transformer, rank=rank, alpha=alpha, targets=targets or self.lora_targets)
        base = "pretrained" if self.transformer_is_pipelines else f"{LORA_BASE_DIR}/transformer"
        self.lora = {"rank": rank, "alpha": alpha, "targets": list(targets or self.lora_targets), "base": base}

    def set_gradient_checkpointing(self, setting: BlockCheckpointing) -> None:
        """Recompute the activations of every transformer block (``True``) or of the first ``setting`` blocks in
        backward instead of storing them."""
        set_block_checkpointing(self.transformer, setting, where="model.options.gradient_checkpointing")

    def save_pretrained(self, path: str | Path) -> None:
        """LoRA, when present, is merged: ``transformer/`` is a plain diffusers transformer; ``lora/`` holds
        the adapters alone in diffusers' LoRA format, and ``lora_base/transformer/`` the weights they sit on
        unless those are the pretrained pipeline's."""
        path = Path(path)
        network = self.transformer
        if has_lora(self.transformer):
            save_lora(self.transformer, path / LORA_DIR, pipeline_class=self.pipeline_class)
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

    def module(self) -> torch.nn.Module:
        return self.transformer

    @contextlib.contextmanager
    def use_snapshot(self, name: str) -> Iterator[Self]:
        if self.variants is not None and name in self.variants:
            raise KeyError(f"{name!r} is a live trainable role; run it with use_component_variant, not as a snapshot")
        with self.snapshots.swapped_in(name, self.transformer):
            yield self
