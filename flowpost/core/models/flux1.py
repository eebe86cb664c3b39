"""The flux1 family (FLUX.1-dev / schnell): a diffusers ``FluxPipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import TextState

T5_MAX_LENGTH = 512  # the stock pipeline's max_sequence_length
DISTILLED_GUIDANCE = 3.5  # the stock pipeline's guidance_scale
RESOLUTION = 1024  # the stock pipeline's default image side in pixels


class Flux1Adapter(PipelineFamily):
    """``FluxTransformer2DModel`` on 2x2-packed ``AutoencoderKL`` latents ``[tokens, 4 * channels]``,
    conditioned by T5 token states and the pooled CLIP vector.

    ``distilled_guidance`` feeds FLUX.1-dev's guidance embedding (schnell has none and ignores it);
    the sampler's ``guidance`` with a negative state is true CFG on top, as ``true_cfg_scale``.
    """

    family: ClassVar[str] = "flux1"
    encoder_name = "flux1"
    output_codec: ClassVar[str] = "AutoencoderKL, (x - shift_factor) * scaling_factor, packed 2x2"
    transformer_class: ClassVar[str] = "FluxTransformer2DModel"
    default_encoder_max_length: ClassVar[int] = T5_MAX_LENGTH
    options: ClassVar[tuple[str, ...]] = ("resolution", "distilled_guidance")
    pipeline_class: ClassVar[str] = "FluxPipeline"
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (
        ("CLIPTextModel", "CLIPTokenizer"),
        ("T5EncoderModel", "T5TokenizerFast"),
    )

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        resolution: int = RESOLUTION,
        distilled_guidance: float = DISTILLED_GUIDANCE,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        self.resolution = resolution
        self.distilled_guidance = distilled_guidance

    @cached_property
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell, from the VAE's config (its weights are not loaded)."""
        from diffusers import AutoencoderKL

        return 2 ** (len(self.source.config("vae", AutoencoderKL)["block_out_channels"]) - 1)

    @property
    def latent_size(self) -> int:
        """The unpacked latent side, even for the 2x2 packing (as the stock pipeline rounds it)."""
        return 2 * (self.resolution // (self.vae_scale_factor * 2))

    @property
    def latent_shape(self) -> tuple[int, int]:
        return ((self.latent_size // 2) ** 2, self.transformer.config.in_channels)

    def inference_sigmas(self, steps: int) -> Tensor:
        """The stock pipeline's: ``linspace(1, 1 / steps, steps)`` through the scheduler with ``mu`` from
        the packed token count (the scheduler applies ``mu`` only when it shifts dynamically, as dev's)."""
        sigmas = None if self.scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        return self.scheduler_sigmas(steps, self.latent_shape[0], sigmas)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep = sigma`` (the stock pipeline's ``t / 1000``), with image and
        text ids and, for dev, the distilled guidance; in the latents' dtype."""
        from diffusers import FluxPipeline

        assert isinstance(state, TextState)
        batch, device, dtype = latents.shape[0], latents.device, latents.dtype
        tokens = state.encoder_hidden_states.to(device=device, dtype=dtype)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((batch,), self.distilled_guidance, device=device, dtype=torch.float32)
        half = self.latent_size // 2
        return self.transformer(
            hidden_states=latents,
            timestep=torch.as_tensor(sigma, dtype=dtype, device=device).expand(batch),
            guidance=guidance,
            pooled_projections=state.pooled_projections.to(device=device, dtype=dtype),
            encoder_hidden_states=tokens,
            txt_ids=torch.zeros(tokens.shape[1], 3, device=device, dtype=dtype),
            img_ids=FluxPipeline._prepare_latent_image_ids(batch, half, half, device, dtype),
            return_dict=False,
        )[0]

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> tuple[Tensor, Tensor]:
        """T5 token states and the pooled CLIP vector (text ids are all zeros, derived at the velocity call)."""
        embeds, pooled, _ = pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, max_sequence_length=max_length
        )
        return embeds, pooled

    def encode_output_state(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to packed latents."""
        from diffusers import FluxPipeline

        latents = self.vae_encode(media)
        batch, channels, height, width = latents.shape
        return FluxPipeline._pack_latents(latents, batch, channels, height, width)

    def decode(self, latents: Tensor) -> Tensor:
        """Packed latents to media in [0, 1], as the stock pipeline decodes."""
        from diffusers import FluxPipeline

        side = self.latent_size * self.vae_scale_factor
        return self.vae_decode(FluxPipeline._unpack_latents(latents, side, side, self.vae_scale_factor))
