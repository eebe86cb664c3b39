"""The flux2 families: FLUX.2-dev (a diffusers ``Flux2Pipeline``) and FLUX.2-klein (``Flux2KleinPipeline``)."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.lora import SD3_ATTENTION_TARGETS
from flowpost.core.models.packed_latents import PackedLatentFamily
from flowpost.core.models.pipeline_prompts import unmasked
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import TextState
from flowpost.core.sampling.schedules import flux2_shift_mu

MAX_SEQUENCE_LENGTH = 512  # the stock pipelines' max_sequence_length (chat-template tokens, padded)
DISTILLED_GUIDANCE = 4.0  # Flux2Pipeline's guidance_scale: FLUX.2-dev's embedded guidance
# both streams' attention projections and the single-stream blocks' fused QKV + MLP input projection
FLUX2_LORA_TARGETS = (*SD3_ATTENTION_TARGETS, "to_qkv_mlp_proj")


class Flux2Family(PackedLatentFamily):
    """``Flux2Transformer2DModel`` on ``AutoencoderKLFlux2`` latents: each 2x2 patch of the VAE's 32 channels is one
    token of 128 channels, normalised by the VAE's batch-norm statistics, ``[tokens, 128]``; conditioned by a
    text model's hidden states at three layers, concatenated per token, every padded position attended (the
    stock pipelines pass no mask); no pooled vector.

    The transformer reads ``timestep = sigma`` and 4-axis RoPE positions: ``(0, row, column, 0)`` per image
    token and ``(0, 0, 0, index)`` per text token, as the stock pipelines build them. Sampling shifts its
    sigmas by FLUX.2's empirical ``mu`` (``flux2_shift_mu``) from the token and step counts.
    """

    output_codec: ClassVar[str] = "AutoencoderKLFlux2, 2x2 patches, (x - bn_mean) / bn_std, packed"
    transformer_class: ClassVar[str] = "Flux2Transformer2DModel"
    vae_class: ClassVar[str] = "AutoencoderKLFlux2"
    default_encoder_max_length: ClassVar[int] = MAX_SEQUENCE_LENGTH
    lora_targets: ClassVar[tuple[str, ...]] = FLUX2_LORA_TARGETS

    @cached_property
    def vae_scale_factor(self) -> int:
        from diffusers import AutoencoderKLFlux2

        return 2 ** (len(self.source.config("vae", AutoencoderKLFlux2)["block_out_channels"]) - 1)

    def dynamic_shift_mu(self, image_seq_len: int, steps: int) -> float:
        """FLUX.2's ``mu`` from the packed token count and the step count."""
        return flux2_shift_mu(image_seq_len, steps)

    def describe(self) -> dict[str, Any]:
        """The manifest, its dynamic shift named as FLUX.2's rule (the scheduler's base and max shift go unread)."""
        description = super().describe()
        if "dynamic_shift" in description["schedule"]:
            description["schedule"]["dynamic_shift"] = {
                "mu": "FLUX.2's empirical fit in the image token and step counts"
            }
        return description

    def inference_sigmas(self, steps: int) -> Tensor:
        """The stock pipelines' ``linspace(1, 1 / steps, steps)`` through the scheduler at FLUX.2's ``mu``."""
        sigmas = None if self.scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        return self.scheduler_sigmas(steps, self.latent_shape[0], sigmas)

    def distilled_guidance_embedding(self, batch: int, device: torch.device) -> Tensor | None:
        """The guidance the transformer embeds (``None``: it has no guidance embedding)."""
        return None

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep = sigma`` with the stock pipelines' positions; in the latents' dtype.

        Positions are integer indices (int64, as the pipelines pass them): text indices reach 511, which bf16
        cannot hold exactly."""
        assert isinstance(state, TextState)
        batch, device, dtype = latents.shape[0], latents.device, latents.dtype
        tokens = state.encoder_hidden_states.to(device=device, dtype=dtype)
        side = self.latent_size // 2
        image_ids = torch.cartesian_prod(*_axes(device, 1, side, side, 1))
        text_ids = torch.cartesian_prod(*_axes(device, 1, 1, 1, tokens.shape[1]))
        return self.transformer(
            hidden_states=latents,
            encoder_hidden_states=tokens,
            timestep=torch.as_tensor(sigma, dtype=dtype, device=device).expand(batch),
            img_ids=image_ids,
            txt_ids=text_ids,
            guidance=self.distilled_guidance_embedding(batch, device),
            return_dict=False,
        )[0].to(dtype)

    def encode_output_state(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to packed tokens: the VAE posterior's mode, 2x2 patches, batch-norm normalised."""
        vae = self.vae_on(media.device)
        pixels = (media * 2.0 - 1.0).to(next(vae.parameters()).dtype)
        patches = self.stock_pipeline._patchify_latents(vae.encode(pixels).latent_dist.mode())
        mean, std = self._bn_statistics(vae, patches)
        normalised = (patches - mean) / std
        return normalised.flatten(2).transpose(1, 2).to(media.dtype)

    def decode(self, latents: Tensor) -> Tensor:
        """Packed tokens to media in [0, 1], as the stock pipelines decode (fp32 result)."""
        vae = self.vae_on(latents.device)
        side = self.latent_size // 2
        patches = latents.transpose(1, 2).reshape(latents.shape[0], latents.shape[2], side, side)
        patches = patches.to(next(vae.parameters()).dtype)
        mean, std = self._bn_statistics(vae, patches)
        unpatched = self.stock_pipeline._unpatchify_latents(patches * std + mean)
        pixels = vae.decode(unpatched, return_dict=False)[0]
        return (pixels.float() / 2.0 + 0.5).clamp(0.0, 1.0)

    @staticmethod
    def _bn_statistics(vae: torch.nn.Module, like: Tensor) -> tuple[Tensor, Tensor]:
        """The VAE's batch-norm running mean and standard deviation per patch channel, shaped ``[1, C, 1, 1]``."""
        bn = vae.bn  # type: ignore[attr-defined]
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, std

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """The pipeline's padded token states, every position attended (text ids are derived at the velocity call)."""
        embeds, _ = pipeline.encode_prompt(prompt=list(prompts), device=device, max_sequence_length=max_length)
        return unmasked(embeds, embeds.new_zeros(embeds.shape[0], 0))


class Flux2Adapter(Flux2Family):
    """FLUX.2-dev: a Mistral-Small-3 text encoder (hidden states of layers 10, 20 and 30 of the prompt in its
    chat template with the pipeline's system message) and an embedded guidance scale, ``distilled_guidance``;
    the sampler's ``guidance`` with a negative state is true CFG on top."""

    family: ClassVar[str] = "flux2"
    encoder_name = "flux2"
    pipeline_class: ClassVar[str] = "Flux2Pipeline"
    options: ClassVar[tuple[str, ...]] = (*PackedLatentFamily.options, "distilled_guidance")
    guidance_distilled: ClassVar[bool] = True  # the guidance scale is embedded: no CFG
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (("Mistral3ForConditionalGeneration", "AutoProcessor"),)

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

    def distilled_guidance_embedding(self, batch: int, device: torch.device) -> Tensor | None:
        if not self.transformer.config.guidance_embeds:
            return None
        return torch.full((batch,), self.distilled_guidance, device=device, dtype=torch.float32)


class Flux2KleinAdapter(Flux2Family):
    """FLUX.2-klein: a Qwen3 text encoder (hidden states of layers 9, 18 and 27 of the prompt in its chat
    template, thinking off) and no guidance embedding. The base checkpoints sample with CFG against the empty
    prompt (the sampler's ``guidance`` is the pipeline's ``guidance_scale``); the step-distilled ones
    (``is_distilled``) with guidance 1."""

    family: ClassVar[str] = "flux2-klein"
    encoder_name = "flux2-klein"
    pipeline_class: ClassVar[str] = "Flux2KleinPipeline"
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (("Qwen3ForCausalLM", "Qwen2TokenizerFast"),)


def _axes(device: torch.device, *sizes: int) -> list[Tensor]:
    """``arange(size)`` for each of the four position axes, int64 on ``device``."""
    return [torch.arange(size, device=device) for size in sizes]
