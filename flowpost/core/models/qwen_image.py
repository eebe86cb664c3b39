"""The qwen-image family (Qwen-Image): a diffusers ``QwenImagePipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.lora import SD3_ATTENTION_TARGETS
from flowpost.core.models.packed_latents import PackedLatentFamily
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import MaskedTextState
from flowpost.core.sampling.guidance import classifier_free_guidance, rescaled_to_conditional_norm

MAX_SEQUENCE_LENGTH = 1024  # the stock pipeline's max_sequence_length (text tokens after the template)
QWEN_IMAGE_LORA_TARGETS = (  # both streams' attention projections and feed-forward layers
    *SD3_ATTENTION_TARGETS,
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
)


class QwenImageAdapter(PackedLatentFamily):
    """``QwenImageTransformer2DModel`` on 2x2-packed ``AutoencoderKLQwenImage`` latents, conditioned by
    the last hidden states of Qwen2.5-VL on the stock prompt template (its first 34 tokens dropped)
    with their padding mask; no pooled vector.

    The sampler's ``guidance`` with a negative state is the pipeline's ``true_cfg_scale``; with
    ``cfg_norm`` (the pipeline's behaviour) each guided token is rescaled to the conditional
    velocity's norm.
    """

    family: ClassVar[str] = "qwen-image"
    encoder_name = "qwen-image"
    output_codec: ClassVar[str] = "AutoencoderKLQwenImage, (x - latents_mean) / latents_std, packed 2x2"
    transformer_class: ClassVar[str] = "QwenImageTransformer2DModel"
    vae_class: ClassVar[str] = "AutoencoderKLQwenImage"
    default_encoder_max_length: ClassVar[int] = MAX_SEQUENCE_LENGTH
    options: ClassVar[tuple[str, ...]] = (*PackedLatentFamily.options, "cfg_norm")
    pipeline_class: ClassVar[str] = "QwenImagePipeline"
    lora_targets: ClassVar[tuple[str, ...]] = QWEN_IMAGE_LORA_TARGETS
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (("Qwen2_5_VLForConditionalGeneration", "Qwen2Tokenizer"),)

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        cfg_norm: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        self.cfg_norm = cfg_norm

    @cached_property
    def vae_scale_factor(self) -> int:
        from diffusers import AutoencoderKLQwenImage

        return 2 ** len(self.source.config("vae", AutoencoderKLQwenImage)["temperal_downsample"])

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """The template's hidden states without its prefix, padded to the longest prompt, and their mask."""
        embeds, mask = pipeline.encode_prompt(prompt=prompts, device=device, max_sequence_length=max_length)
        if mask is None:  # the pipeline drops a mask without padding
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return ConditionBatch(embeds, mask, embeds.new_zeros(len(prompts), 0))

    def prepare_condition_state(self, batch: ConditionBatch) -> MaskedTextState:
        return MaskedTextState.from_batch(batch)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep = sigma`` (the stock pipeline's ``t / 1000``) with the text mask
        and the image's patch grid; in the latents' dtype."""
        assert isinstance(state, MaskedTextState)
        batch, device, dtype = latents.shape[0], latents.device, latents.dtype
        mask = state.mask()
        half = self.latent_size // 2
        return self.transformer(
            hidden_states=latents,
            timestep=torch.as_tensor(sigma, dtype=dtype, device=device).expand(batch),
            encoder_hidden_states=state.encoder_hidden_states.to(device=device, dtype=dtype),
            encoder_hidden_states_mask=None if mask is None else mask.to(device),
            img_shapes=[[(1, half, half)]] * batch,
            return_dict=False,
        )[0]

    def guided(self, v_pos: Tensor, v_neg: Tensor, guidance: float) -> Tensor:
        """True CFG, rescaled per token to the conditional velocity's norm when ``cfg_norm``."""
        guided = classifier_free_guidance(v_pos, v_neg, guidance)
        return rescaled_to_conditional_norm(guided, v_pos) if self.cfg_norm else guided

    def _latent_statistics(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """The VAE's per-channel ``latents_mean`` and ``1 / latents_std`` as ``[1, C, 1, 1, 1]``."""
        config = self.vae.config
        mean = torch.tensor(config.latents_mean, device=like.device)  # fp32, then cast, as the pipeline
        inverse_std = 1.0 / torch.tensor(config.latents_std, device=like.device)
        return mean.to(like.dtype).view(1, -1, 1, 1, 1), inverse_std.to(like.dtype).view(1, -1, 1, 1, 1)

    @property
    def pixel_shape(self) -> tuple[int, ...]:
        """``[3, 1, H, W]``: the video VAE encodes an image as one frame."""
        return (3, 1, self.resolution, self.resolution)

    def vae_encode(self, media: Tensor) -> Tensor:
        """Media ``[B, 3, H, W]`` in [0, 1] to latents ``[B, C, 1, h, w]``: the posterior's mean, then
        ``(x - latents_mean) / latents_std``."""
        vae = self.vae_on(media.device)
        pixels = (media * 2.0 - 1.0).unsqueeze(2).to(next(vae.parameters()).dtype)
        latents = vae.encode(pixels).latent_dist.mode()
        mean, inverse_std = self._latent_statistics(latents)
        return ((latents - mean) * inverse_std).to(media.dtype)

    def vae_decode(self, latents: Tensor) -> Tensor:
        """Latents ``[B, C, 1, h, w]`` to media in [0, 1], as the stock pipeline decodes (fp32 result)."""
        vae = self.vae_on(latents.device)
        latents = latents.to(next(vae.parameters()).dtype)
        mean, inverse_std = self._latent_statistics(latents)
        pixels = vae.decode(latents / inverse_std + mean, return_dict=False)[0][:, :, 0]
        return (pixels.float() / 2.0 + 0.5).clamp(0.0, 1.0)
