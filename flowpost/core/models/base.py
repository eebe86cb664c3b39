"""The model adapter interface every family implements."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.io import sha256_json
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_encoders import ConditionEncoder
from flowpost.core.roles import ComponentVariants
from flowpost.core.sampling.guidance import classifier_free_guidance
from flowpost.core.sampling.schedules import inference_sigmas
from flowpost.errors import FlowpostError

ADAPTER_FILE = "flowpost_adapter.json"
LORA_DIR = "lora"  # beside transformer/: the LoRA adapters alone, in diffusers' LoRA format
LORA_BASE_DIR = "lora_base"  # the weights those adapters sit on, unless a pretrained pipeline's
DEFAULT_ENCODER_MAX_LENGTH = 16


class ModelAdapter(ABC):
    """Wraps a diffusers transformer with its condition encoder, output codec and snapshots.

    Convention: ``x_sigma = (1 - sigma) * x0 + sigma * noise``; the model predicts the velocity
    ``noise - x0``.
    """

    family: ClassVar[str]
    encoder_name: str
    encoder_max_length: int = DEFAULT_ENCODER_MAX_LENGTH
    compute_dtype: torch.dtype | None = None  # autocast dtype of the network (mixed precision); None: none
    shift: float = 1.0  # the constant sigma shift of training and (by default) inference sigmas
    fps: int = 16  # frames per second a video family's samples are written at
    options: ClassVar[tuple[str, ...]] = ()  # the constructor options ``model.options`` may set
    guidance_distilled: ClassVar[bool] = False  # no unconditional branch trained (sampled without CFG): FLUX.1
    fsdp_shardable: ClassVar[bool] = True  # every rank runs the same blocks in a pass (not routed experts)
    variants: ComponentVariants | None = None  # the trainable roles, once declared
    compile_settings: tuple[bool, dict[str, Any]] | None = None  # (regional, torch.compile options) once compiled

    @classmethod
    @abstractmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict | None = None) -> ModelAdapter:
        """A randomly initialised model (seeded, global RNG untouched)."""

    @classmethod
    def scratch_channels(cls, overrides: dict | None = None) -> int | None:
        """The image channels ``from_scratch(overrides=...)`` would take in pixel space, read from its config
        without building it; None for a family whose media go through a VAE."""
        return None

    @classmethod
    @abstractmethod
    def from_pretrained(cls, path: str | Path) -> ModelAdapter:
        """Load what ``save_pretrained`` wrote."""

    @classmethod
    def from_pipeline(cls, source: PretrainedSource, **options: Any) -> ModelAdapter:
        """Load a diffusers pipeline (folder or hub id); real families implement it."""
        raise FlowpostError(f"family {cls.family!r} loads no diffusers pipeline; remove it", where="model.pretrained")

    @classmethod
    def prompt_encoder(cls, source: PretrainedSource, *, max_length: int) -> ConditionEncoder:
        """This family's own text encoders from a diffusers pipeline, as the conditions node runs them."""
        raise FlowpostError(
            f"family {cls.family!r} has no text encoders of its own; use a registered encoder (encoder: minilm)",
            where="conditions.*.model.family",
        )

    def save_pipeline(self, path: str | Path) -> None:
        """A complete diffusers pipeline folder with this transformer (LoRA merged); real families implement it."""
        raise FlowpostError(
            f"family {self.family!r} has no diffusers pipeline; remove 'pipeline'", where="export.formats"
        )

    @abstractmethod
    def save_pretrained(self, path: str | Path) -> None:
        """Write the trainable network as a diffusers folder plus an adapter manifest."""

    @abstractmethod
    def add_lora(self, *, rank: int, alpha: float, targets: list[str] | None = None) -> None:
        """Freeze the network and train LoRA adapters instead (PEFT); exports merge them."""

    def inference_sigmas(self, steps: int) -> Tensor:
        """The ``steps + 1`` sigmas rollouts, evaluation and sampling integrate over (fp32, CPU, ending at 0).

        By default flowpost's equal-step grid with this model's shift; a family with a diffusers scheduler
        returns that scheduler's, so sampling reproduces the stock pipeline.
        """
        return inference_sigmas(steps, shift=self.shift)

    def training_sigmas(self, sigma: Tensor) -> Tensor:
        """Training sigma draws in [0, 1] mapped onto the sigmas the trainable network denoises: all of them,
        unless a family trains part of a routed network (one Wan2.2 expert)."""
        return sigma

    @abstractmethod
    def describe(self) -> dict:
        """Family, encoder, output codec and schedule, as the export manifest records them."""

    @property
    @abstractmethod
    def latent_shape(self) -> tuple[int, ...]:
        """Shape of one sample's latent (without the batch dimension)."""

    @abstractmethod
    def module(self) -> torch.nn.Module:
        """The trainable network."""

    def trainable_network(self) -> torch.nn.Module:
        """What the parallel layout prepares: the network, or the bundle of every trainable role's copy."""
        return self.module()

    def role_networks(self) -> list[torch.nn.Module]:
        """Each trainable role's network (the network alone without declared roles): FSDP2 roots."""
        return [self.module()]

    def compile_networks(self, *, regional: bool, options: dict[str, Any], where: str = "model.compile") -> None:
        """``torch.compile`` every trainable role's network in place (its repeated blocks when ``regional``);
        role copies declared later are compiled alike."""
        from flowpost.core.models.compile import compile_network

        self.compile_settings = (regional, dict(options))
        for network in self.role_networks():
            compile_network(network, regional=regional, options=options, where=where)

    def add_component_variants(self, roles: Sequence[str]) -> None:
        """Declare ordered trainable roles, each a live copy of the network (the first owns the base)."""
        raise FlowpostError(f"family {self.family!r} holds one trainable network; it has no roles", where="trainer")

    def use_component_variant(self, role: str) -> contextlib.AbstractContextManager:
        """Temporarily run (and train) the network of trainable role ``role``."""
        raise KeyError(f"{role!r}: family {self.family!r} declares no trainable roles")

    def shard_units(self) -> list[torch.nn.Module]:
        """The blocks FSDP2 shards one by one (diffusers' ``transformer_blocks`` and ``single_transformer_blocks``)."""
        return [
            block
            for network in self.role_networks()
            for name in ("transformer_blocks", "single_transformer_blocks")
            for block in getattr(network, name, [])
        ]

    def encode_conditions(self, prompts: list[str], *, max_length: int | None = None) -> ConditionBatch:
        """Encode prompts with this family's encoder, by default at the length it was trained with."""
        from flowpost.core.models.text_encoders import build_encoder

        length = self.encoder_max_length if max_length is None else max_length
        return build_encoder(self.encoder_name, max_length=length).encode(prompts)

    @abstractmethod
    def prepare_condition_state(self, batch: ConditionBatch) -> ConditionState:
        """Turn cached embeddings into what ``velocity`` consumes; once per batch."""

    @abstractmethod
    def encode_output_state(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to the model's latent space (VAE encode, or identity up to scaling)."""

    @abstractmethod
    def decode(self, latents: Tensor) -> Tensor:
        """Latents to media in [0, 1]."""

    def codec_fingerprint(self) -> str:
        """Identifies what ``encode_output_state`` computes, as a latent cache records it: the family and its
        output codec (families with a VAE add its weights)."""
        return sha256_json({"family": self.family, "codec": getattr(self, "output_codec", type(self).__name__)})

    def velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """One conditional velocity prediction in the latents' dtype; ``sigma`` is a scalar or per-sample [B].

        With ``compute_dtype`` set (``launch.mixed_precision``) the network runs under autocast in
        that dtype, while weights, gradients and the returned velocity stay in the latents' dtype.
        """
        if self.compute_dtype is None:
            return self.predict_velocity(latents, sigma, state)
        with torch.autocast(latents.device.type, dtype=self.compute_dtype):
            velocity = self.predict_velocity(latents, sigma, state)
        return velocity.to(latents.dtype)

    @abstractmethod
    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The network's velocity prediction (``velocity`` adds mixed precision around it)."""

    def forward(
        self,
        latents: Tensor,
        sigma: Tensor,
        state: ConditionState,
        *,
        guidance: float = 1.0,
        negative: ConditionState | None = None,
    ) -> Tensor:
        """Velocity with classifier-free guidance (``guided``): ``v_neg + guidance * (v_pos - v_neg)`` by default."""
        if guidance == 1.0:
            return self.velocity(latents, sigma, state)
        if negative is None:
            raise ValueError("guidance != 1 needs the negative (null-prompt) condition state")
        both = type(state).cat([state, negative])
        sigma_t = torch.as_tensor(sigma, dtype=latents.dtype, device=latents.device).expand(latents.shape[0])
        v_pos, v_neg = self.velocity(torch.cat([latents, latents]), torch.cat([sigma_t, sigma_t]), both).chunk(2)
        return self.guided(v_pos, v_neg, guidance)

    def guided(self, v_pos: Tensor, v_neg: Tensor, guidance: float) -> Tensor:
        """The guided velocity from the conditional and negative ones (a family may rescale it)."""
        return classifier_free_guidance(v_pos, v_neg, guidance)

    @abstractmethod
    def use_snapshot(self, name: str) -> contextlib.AbstractContextManager:
        """Temporarily run with the named snapshot's weights (``ref``, ``ema``, ``old``)."""
