"""The flux1 family (FLUX.1-dev / schnell): a diffusers ``FluxPipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.packed_latents import PackedLatentFamily
from flowpost.core.models.pipeline_prompts import unmasked
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import TextState

T5_MAX_LENGTH = 512  # the stock pipeline's max_sequence_length
DISTILLED_GUIDANCE = 3.5  # the stock pipeline's guidance_scale


class Flux1Adapter(PackedLatentFamily):
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
    options: ClassVar[tuple[str, ...]] = (*PackedLatentFamily.options, "distilled_guidance")
    pipeline_class: ClassVar[str] = "FluxPipeline"
    guidance_distilled: ClassVar[bool] = True  # dev embeds the guidance scale, schnell is step-distilled: no CFG
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
        distilled_guidance: float = DISTILLED_GUIDANCE,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        self.distilled_guidance = distilled_guidance

    @cached_property
    def vae_scale_factor(self) -> int:
        from diffusers import AutoencoderKL

        return 2 ** (len(self.source.config("vae", AutoencoderKL)["block_out_channels"]) - 1)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep = sigma`` (the stock pipeline's ``t / 1000``), with image and
        text ids and, for dev, the distilled guidance; in the latents' dtype."""
        return self.flux_velocity(latents, self.image_ids(self.latent_size // 2, latents), sigma, state)

    @staticmethod
    def image_ids(side: int, like: Tensor, *, first: int = 0) -> Tensor:
        """The stock pipeline's ids ``[side * side, 3]`` of a square grid of packed tokens (row, column in the last
        two coordinates, ``first`` in the first), on ``like``'s device and dtype."""
        from diffusers import FluxPipeline

        ids = FluxPipeline._prepare_latent_image_ids(1, side, side, like.device, like.dtype)
        ids[:, 0] = first
        return ids

    def flux_velocity(self, hidden: Tensor, img_ids: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer's output at every token of ``hidden`` placed at ``img_ids``, read with the text of
        ``state`` (a ``TextState``) and, for dev, the distilled guidance; in ``hidden``'s dtype."""
        assert isinstance(state, TextState)
        batch, device, dtype = hidden.shape[0], hidden.device, hidden.dtype
        tokens = state.encoder_hidden_states.to(device=device, dtype=dtype)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((batch,), self.distilled_guidance, device=device, dtype=torch.float32)
        return self.transformer(
            hidden_states=hidden,
            timestep=torch.as_tensor(sigma, dtype=dtype, device=device).expand(batch),
            guidance=guidance,
            pooled_projections=state.pooled_projections.to(device=device, dtype=dtype),
            encoder_hidden_states=tokens,
            txt_ids=torch.zeros(tokens.shape[1], 3, device=device, dtype=dtype),
            img_ids=img_ids,
            return_dict=False,
        )[0]

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """T5 token states and the pooled CLIP vector (text ids are all zeros, derived at the velocity call)."""
        embeds, pooled, _ = pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, max_sequence_length=max_length
        )
        return unmasked(embeds, pooled)
