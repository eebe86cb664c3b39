"""The sd3 family (SD3 / SD3.5): a diffusers ``StableDiffusion3Pipeline`` folder or hub id."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.pipeline_prompts import unmasked
from flowpost.core.models.sd3_transformer import SD3TransformerAdapter

T5_MAX_LENGTH = 256  # the stock pipeline's max_sequence_length


class SD3Adapter(PipelineFamily, SD3TransformerAdapter):
    """``SD3Transformer2DModel`` on ``AutoencoderKL`` latents, conditioned by CLIP-L + CLIP-G + T5.

    The transformer and scheduler load with the adapter; the VAE and the text encoders on first use
    (``PipelineFamily``).
    """

    family: ClassVar[str] = "sd3"
    encoder_name = "sd3"
    output_codec: ClassVar[str] = "AutoencoderKL, (x - shift_factor) * scaling_factor"
    transformer_class: ClassVar[str] = "SD3Transformer2DModel"
    default_encoder_max_length: ClassVar[int] = T5_MAX_LENGTH
    pipeline_class: ClassVar[str] = "StableDiffusion3Pipeline"
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (  # CLIP-L, CLIP-G, T5
        ("CLIPTextModelWithProjection", "CLIPTokenizer"),
        ("CLIPTextModelWithProjection", "CLIPTokenizer"),
        ("T5EncoderModel", "T5TokenizerFast"),
    )

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
