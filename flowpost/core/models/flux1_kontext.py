"""The flux1-kontext family (FLUX.1-Kontext): a diffusers ``FluxKontextPipeline`` folder or hub id."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.edit_encoder import packed_sources
from flowpost.core.models.edit_family import EditAdapter
from flowpost.core.models.edit_state import PooledEditState
from flowpost.core.models.flux1 import Flux1Adapter
from flowpost.core.models.pipeline_prompts import unmasked
from flowpost.errors import FlowpostError


class Flux1KontextAdapter(EditAdapter, Flux1Adapter):
    """FLUX.1's transformer, VAE, text encoders and scheduler conditioned on an instruction and a source image:
    the source's packed latents follow the noisy latents along the token sequence, their image ids 1 in the
    first coordinate; the velocity is the output at the noisy tokens (``pipeline_flux_kontext.py``).

    A condition row is one edit (``instruction [source DIGEST]``, ``core/edit_prompts.py``): the instruction's
    T5 token states and its pooled CLIP vector (the text encoders never see the image), then the source's
    latents, flattened in ``pooled`` after the CLIP vector. The sources are read at the stock pipeline's
    preferred resolution for their aspect ratio (1024 x 1024 for the square sources of the edit datasets).
    Guidance-distilled like FLUX.1-dev; true CFG (``guidance`` with a negative) reads the negative text with each
    sample's own source, as the stock ``true_cfg_scale``.
    """

    family: ClassVar[str] = "flux1-kontext"
    encoder_name = "flux1-kontext"
    pipeline_class: ClassVar[str] = "FluxKontextPipeline"

    @classmethod
    def edit_conditions(
        cls,
        pipeline: Any,
        instructions: list[str],
        images: list[list[Any]],
        *,
        device: torch.device,
        max_length: int,
        sources: bool,
    ) -> ConditionBatch:
        """As the stock pipeline's ``__call__`` prepares an edit: the instruction through ``encode_prompt``, each
        square source resized to the preferred side and VAE-encoded (``packed_sources``) after the pooled vector;
        an edit of several sources is refused (the stock pipeline reads one)."""
        if counts := sorted({len(row) for row in images} - {1}):
            raise FlowpostError(
                f"{cls.family} reads one source image per edit; the edit prompts name {counts[0]}",
                where="conditions",
            )
        multiple = pipeline.vae_scale_factor * 2
        side = cls.source_side() // multiple * multiple
        resized = [pipeline.image_processor.resize(image, side, side) for [image] in images]
        embeds, pooled, _ = pipeline.encode_prompt(
            prompt=instructions, prompt_2=None, device=device, max_sequence_length=max_length
        )
        pixels = pipeline.image_processor.preprocess(resized, side, side)
        latents = packed_sources(pipeline, pixels, encode=sources).to(pooled.device)
        return unmasked(embeds, torch.cat([pooled.float(), latents], dim=1))

    @classmethod
    def source_side(cls) -> int:
        """The side of the stock pipeline's preferred resolution for a square source (its ``_auto_resize``)."""
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

        _, width, height = min((abs(1.0 - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        assert width == height, "the preferred resolutions hold a square one"
        return width

    def prepare_condition_state(self, batch: ConditionBatch) -> PooledEditState:
        config = self.transformer.config
        return PooledEditState.from_edit_batch(
            batch, pooled_width=int(config.pooled_projection_dim), channels=int(config.in_channels)
        )

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer on the noisy tokens followed by the source's (ids 0 and 1 in the first coordinate), at
        ``timestep = sigma``; the velocity of the noisy tokens, in the latents' dtype."""
        assert isinstance(state, PooledEditState)
        tokens = latents.shape[1]
        ids = [self.image_ids(self.latent_size // 2, latents), self.image_ids(state.source_grid, latents, first=1)]
        hidden = torch.cat([latents, state.source_latents.to(device=latents.device, dtype=latents.dtype)], dim=1)
        return self.flux_velocity(hidden, torch.cat(ids), sigma, state)[:, :tokens]

    def forward(
        self,
        latents: Tensor,
        sigma: Tensor,
        state: ConditionState,
        *,
        guidance: float = 1.0,
        negative: ConditionState | None = None,
    ) -> Tensor:
        """``Flux1Adapter.forward`` with the negative text read with each row's own source."""
        if negative is not None and guidance != 1.0:
            assert isinstance(state, PooledEditState) and isinstance(negative, PooledEditState)
            negative = state.with_text(negative)
        return super().forward(latents, sigma, state, guidance=guidance, negative=negative)
