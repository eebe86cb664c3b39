"""The sd3 family (SD3 / SD3.5): a diffusers ``StableDiffusion3Pipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.pipeline_prompts import unmasked
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.sd3_transformer import SD3TransformerAdapter
from flowpost.errors import FlowpostError

T5_MAX_LENGTH = 256  # the stock pipeline's max_sequence_length


class SD3Adapter(PipelineFamily, SD3TransformerAdapter):
    """``SD3Transformer2DModel`` on ``AutoencoderKL`` latents, conditioned by CLIP-L + CLIP-G + T5.

    The transformer and scheduler load with the adapter; the VAE and the text encoders on first use
    (``PipelineFamily``). ``resolution`` is the square image side in pixels (default: the stock pipeline's,
    the transformer's ``sample_size`` latent cells); the latents are ``[C, resolution / s, resolution / s]``
    with ``s`` the VAE's downsampling factor, and the transformer's positional embedding
    (``pos_embed_max_size`` patches a side) bounds it.
    """

    family: ClassVar[str] = "sd3"
    encoder_name = "sd3"
    output_codec: ClassVar[str] = "AutoencoderKL, (x - shift_factor) * scaling_factor"
    transformer_class: ClassVar[str] = "SD3Transformer2DModel"
    default_encoder_max_length: ClassVar[int] = T5_MAX_LENGTH
    pipeline_class: ClassVar[str] = "StableDiffusion3Pipeline"
    options: ClassVar[tuple[str, ...]] = ("resolution", "gradient_checkpointing")
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (  # CLIP-L, CLIP-G, T5
        ("CLIPTextModelWithProjection", "CLIPTokenizer"),
        ("CLIPTextModelWithProjection", "CLIPTokenizer"),
        ("T5EncoderModel", "T5TokenizerFast"),
    )

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        resolution: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        self.resolution = self._checked_resolution(resolution)

    @cached_property
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell, from the VAE's config (its weights are not loaded)."""
        from diffusers import AutoencoderKL

        return 2 ** (len(self.source.config("vae", AutoencoderKL)["block_out_channels"]) - 1)

    def _checked_resolution(self, resolution: int | None) -> int:
        """``resolution``, or the stock default; refused unless whole patches of latent cells that the
        transformer's positional embedding covers."""
        config = self.transformer.config
        scale, patch = self.vae_scale_factor, config.patch_size
        if resolution is None:
            return config.sample_size * scale
        multiple = scale * patch
        whole = isinstance(resolution, int) and not isinstance(resolution, bool)
        if not whole or resolution < multiple or resolution % multiple:
            raise FlowpostError(
                f"resolution {resolution!r} is not a positive multiple of {multiple} pixels (VAE factor {scale} x "
                f"patch {patch}); use e.g. {config.sample_size * scale}",
                where="model.options.resolution",
            )
        limit = config.pos_embed_max_size
        if limit is not None and resolution // multiple > limit:
            raise FlowpostError(
                f"resolution {resolution} is {resolution // multiple} patches a side, beyond the {limit} the "
                f"transformer's positional embedding covers (pos_embed_max_size); use at most {limit * multiple}",
                where="model.options.resolution",
            )
        return resolution

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        side = self.resolution // self.vae_scale_factor
        return (self.transformer.config.in_channels, side, side)

    def inference_sigmas(self, steps: int) -> Tensor:
        """The scheduler's sigmas for ``steps`` (``set_timesteps(steps)``), as the stock pipeline integrates."""
        _, height, width = self.latent_shape
        patch = self.transformer.config.patch_size
        return self.scheduler_sigmas(steps, (height // patch) * (width // patch))

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """[CLIP-L | CLIP-G] padded to the T5 width, then T5 tokens; pooled CLIP-L + CLIP-G."""
        embeds, _, pooled, _ = pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=device,
            do_classifier_free_guidance=False,
            max_sequence_length=max_length,
        )
        return unmasked(embeds, pooled)

    def encode_output_state(self, media: Tensor) -> Tensor:
        return self.vae_encode(media)

    def decode(self, latents: Tensor) -> Tensor:
        return self.vae_decode(latents)
