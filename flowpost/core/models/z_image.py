"""The z-image family (Z-Image-Turbo and Z-Image base): a diffusers ``ZImagePipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.compile import repeated_blocks
from flowpost.core.models.packed_latents import RESOLUTION, checked_resolution
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import MaskedTextState
from flowpost.errors import FlowpostError

MAX_SEQUENCE_LENGTH = 512  # the stock pipeline's max_sequence_length (chat-template tokens)
Z_IMAGE_LORA_TARGETS = (  # the single-stream blocks' attention projections and SwiGLU feed-forward
    "attention.to_q",
    "attention.to_k",
    "attention.to_v",
    "attention.to_out.0",
    "feed_forward.w1",
    "feed_forward.w2",
    "feed_forward.w3",
)


class ZImageAdapter(PipelineFamily):
    """``ZImageTransformer2DModel`` on ``AutoencoderKL`` latents ``[C, h, w]`` (the transformer patches them
    2x2 itself), conditioned by Qwen3's second-to-last hidden states of the prompt in its chat template, each
    row without its padding; no pooled vector.

    The transformer reads ``t = 1 - sigma`` and predicts ``x0 - noise``: the velocity is its negation, as the
    stock pipeline steps. Guidance: the sampler's ``guidance`` g with a negative state is the pipeline's
    ``guidance_scale + 1`` (it computes ``v_pos + s * (v_pos - v_neg)``); Z-Image-Turbo samples without CFG
    (``guidance_scale`` 0, here guidance 1), the base model with it. ``cfg_normalization`` > 0 caps each
    guided sample's norm at that multiple of the conditional one's, as the pipeline's option.
    """

    family: ClassVar[str] = "z-image"
    encoder_name = "z-image"
    output_codec: ClassVar[str] = "AutoencoderKL, (x - shift_factor) * scaling_factor"
    transformer_class: ClassVar[str] = "ZImageTransformer2DModel"
    pipeline_class: ClassVar[str] = "ZImagePipeline"
    default_encoder_max_length: ClassVar[int] = MAX_SEQUENCE_LENGTH
    options: ClassVar[tuple[str, ...]] = ("resolution", "gradient_checkpointing", "cfg_normalization")
    lora_targets: ClassVar[tuple[str, ...]] = Z_IMAGE_LORA_TARGETS
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (("Qwen3Model", "Qwen2Tokenizer"),)

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        resolution: int = RESOLUTION,
        cfg_normalization: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        self.resolution = checked_resolution(resolution)
        if isinstance(cfg_normalization, bool) or not isinstance(cfg_normalization, int | float):
            raise FlowpostError(
                f"cfg_normalization {cfg_normalization!r} is not a number; give 0 (off) or e.g. 1.0",
                where="model.options.cfg_normalization",
            )
        if cfg_normalization < 0:
            raise FlowpostError(
                f"cfg_normalization {cfg_normalization} is negative; give 0 (off) or a positive norm ratio",
                where="model.options.cfg_normalization",
            )
        self.cfg_normalization = float(cfg_normalization)

    @cached_property
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell, from the VAE's config (its weights are not loaded)."""
        from diffusers import AutoencoderKL

        return 2 ** (len(self.source.config("vae", AutoencoderKL)["block_out_channels"]) - 1)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """``[C, h, w]`` with ``h = w`` even, as the stock pipeline rounds the side for the 2x2 patches."""
        side = 2 * (self.resolution // (self.vae_scale_factor * 2))
        return (self.transformer.config.in_channels, side, side)

    def inference_sigmas(self, steps: int) -> Tensor:
        """The stock pipeline's: its ``linspace(1, 1 / steps, steps)`` through the scheduler (constant
        ``shift`` for the published configs; ``mu`` from the image token count if a config shifts dynamically)."""
        from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

        _, height, width = self.latent_shape
        sigmas = np.array(get_default_z_image_sigmas(steps))
        return self.scheduler_sigmas(steps, (height // 2) * (width // 2), sigmas)

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """Each prompt's unpadded hidden states, padded here to the longest row, and their mask."""
        rows, _ = pipeline.encode_prompt(  # a copy: the pipeline writes the templated prompts into the list
            prompt=list(prompts), device=device, do_classifier_free_guidance=False, max_sequence_length=max_length
        )
        length = max(len(row) for row in rows)
        states = rows[0].new_zeros(len(rows), length, rows[0].shape[-1])
        mask = torch.zeros(len(rows), length, dtype=torch.long, device=states.device)
        for index, row in enumerate(rows):
            states[index, : len(row)] = row
            mask[index, : len(row)] = 1
        return ConditionBatch(states, mask, states.new_zeros(len(rows), 0))

    def prepare_condition_state(self, batch: ConditionBatch) -> MaskedTextState:
        return MaskedTextState.from_batch(batch)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer on each sample's latents and real text tokens at ``t = (1000 - 1000 sigma) / 1000``
        (the stock pipeline's), negated; in the latents' dtype."""
        assert isinstance(state, MaskedTextState)
        batch, device, dtype = latents.shape[0], latents.device, latents.dtype
        timestep = torch.as_tensor(sigma, dtype=dtype, device=device).expand(batch) * 1000
        tokens = state.encoder_hidden_states.to(device=device, dtype=dtype)
        mask = state.encoder_attention_mask.to(device)
        output = self.transformer(
            list(latents.unsqueeze(2).unbind(0)),
            (1000 - timestep) / 1000,
            [tokens[row][mask[row]] for row in range(batch)],
            return_dict=False,
        )[0]
        return -torch.stack(output).squeeze(2).to(dtype)

    def guided(self, v_pos: Tensor, v_neg: Tensor, guidance: float) -> Tensor:
        """``v_pos + (guidance - 1) * (v_pos - v_neg)``, each sample's norm capped at ``cfg_normalization``
        times the conditional one's when that is set."""
        guided = v_pos + (guidance - 1.0) * (v_pos - v_neg)
        if self.cfg_normalization <= 0:
            return guided
        cap = torch.linalg.vector_norm(v_pos.flatten(1), dim=1) * self.cfg_normalization
        norm = torch.linalg.vector_norm(guided.flatten(1), dim=1)
        scale = torch.where(norm > cap, cap / norm, torch.ones_like(norm))
        return guided * scale.view(-1, *[1] * (guided.dim() - 1))

    def shard_units(self) -> list[torch.nn.Module]:
        """The refiner and main blocks of every trainable role's network."""
        return [block for network in self.role_networks() for block in repeated_blocks(network)]

    def encode_output_state(self, media: Tensor) -> Tensor:
        return self.vae_encode(media)

    def decode(self, latents: Tensor) -> Tensor:
        return self.vae_decode(latents)
