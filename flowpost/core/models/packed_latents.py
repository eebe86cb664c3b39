"""What the families on 2x2-packed latent tokens share (flux1, flux2, qwen-image): the square resolution, the
latent shape, the stock pipeline's packing and its dynamic-shift sigmas."""

from __future__ import annotations

from abc import abstractmethod
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.errors import FlowpostError

RESOLUTION = 1024  # the stock pipelines' default image side in pixels


def checked_resolution(resolution: Any) -> int:
    """``resolution``, refused unless a positive multiple of 16 pixels (the VAE's 8 times the 2x2 patch)."""
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 16 or resolution % 16:
        raise FlowpostError(
            f"resolution {resolution!r} is not a positive multiple of 16 pixels; use e.g. 512 or 1024",
            where="model.options.resolution",
        )
    return resolution


class PackedLatentFamily(PipelineFamily):
    """A transformer reading VAE latents as 2x2 patches, ``[tokens, 4 * channels]``, at a square
    ``resolution``; packing and unpacking are the stock pipeline's own (``pipeline_class``)."""

    options: ClassVar[tuple[str, ...]] = ("resolution", "gradient_checkpointing")

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        resolution: int = RESOLUTION,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        self.resolution = checked_resolution(resolution)

    @cached_property
    @abstractmethod
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell, from the VAE's config (its weights are not loaded)."""

    @property
    def latent_size(self) -> int:
        """The unpacked latent side, even for the 2x2 packing (as the stock pipeline rounds it)."""
        return 2 * (self.resolution // (self.vae_scale_factor * 2))

    @property
    def latent_shape(self) -> tuple[int, int]:
        return ((self.latent_size // 2) ** 2, self.transformer.config.in_channels)

    def inference_sigmas(self, steps: int) -> Tensor:
        """The stock pipeline's: ``linspace(1, 1 / steps, steps)`` through the scheduler with ``mu`` from
        the packed token count (the scheduler applies ``mu`` only when it shifts dynamically)."""
        sigmas = None if self.scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        return self.scheduler_sigmas(steps, self.latent_shape[0], sigmas)

    @property
    def stock_pipeline(self) -> Any:
        """The diffusers pipeline class, whose static methods pack and unpack."""
        import diffusers

        return getattr(diffusers, self.pipeline_class)

    def encode_output_state(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to packed latents."""
        latents = self.vae_encode(media)
        batch, channels, *_, height, width = latents.shape
        return self.stock_pipeline._pack_latents(latents, batch, channels, height, width)

    def decode(self, latents: Tensor) -> Tensor:
        """Packed latents to media in [0, 1], as the stock pipeline decodes."""
        side = self.latent_size * self.vae_scale_factor
        return self.vae_decode(self.stock_pipeline._unpack_latents(latents, side, side, self.vae_scale_factor))
