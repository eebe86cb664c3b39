"""The wan2 family (Wan2.1 T2V, Wan2.2 TI2V-5B as text to video): a diffusers ``WanPipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.block_checkpointing import BlockCheckpointing
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import MaskedTextState
from flowpost.errors import FlowpostError

UMT5_MAX_LENGTH = 512  # the stock pipeline's max_sequence_length
HEIGHT, WIDTH, FRAMES, FPS = 480, 832, 81, 16  # the stock pipeline's defaults (Wan2.1 at 480p)
WAN_ATTENTION_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # self- and cross-attention of every block
SCHEDULERS = ("FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler")  # the ones Wan pipelines ship


class Wan2Adapter(PipelineFamily):
    """``WanTransformer3DModel`` on ``AutoencoderKLWan`` video latents ``[C, T, H, W]``, conditioned by UMT5
    token states (zero past each prompt's length, as the stock pipeline pads them); true CFG.

    ``height``, ``width`` and ``num_frames`` are the generated video's (``num_frames - 1`` a multiple of the
    VAE's temporal factor); ``fps`` the rate a sample is written at; ``vae_tiling`` decodes in spatial tiles
    (the VAE always decodes one video at a time, sliced); ``gradient_checkpointing`` recomputes each block's
    activations in backward.
    """

    family: ClassVar[str] = "wan2"
    encoder_name = "wan2"
    output_codec: ClassVar[str] = "AutoencoderKLWan, (x - latents_mean) / latents_std, video [C, T, H, W]"
    transformer_class: ClassVar[str] = "WanTransformer3DModel"
    vae_class: ClassVar[str] = "AutoencoderKLWan"
    lora_targets: ClassVar[tuple[str, ...]] = WAN_ATTENTION_TARGETS
    default_encoder_max_length: ClassVar[int] = UMT5_MAX_LENGTH
    options: ClassVar[tuple[str, ...]] = (
        "height",
        "width",
        "num_frames",
        "fps",
        "vae_tiling",
        "gradient_checkpointing",
    )
    pipeline_class: ClassVar[str] = "WanPipeline"
    scheduler_classes: ClassVar[tuple[str, ...]] = SCHEDULERS
    text_models: ClassVar[tuple[tuple[str, str], ...]] = (("UMT5EncoderModel", "AutoTokenizer"),)

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        height: int = HEIGHT,
        width: int = WIDTH,
        num_frames: int = FRAMES,
        fps: int = FPS,
        vae_tiling: bool = False,
        gradient_checkpointing: BlockCheckpointing = False,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, gradient_checkpointing=gradient_checkpointing, **options)
        self.height, self.width, self.num_frames, self.fps = height, width, num_frames, fps
        self.vae_tiling, self.gradient_checkpointing = vae_tiling, gradient_checkpointing
        self._check_video_size()

    @classmethod
    def _load(cls, source: PretrainedSource, *, weights: bool = True) -> tuple[torch.nn.Module, Any]:
        """A one-transformer Wan pipeline (Wan2.1 T2V, Wan2.2 TI2V-5B: its per-token timesteps are all the
        same in text to video, so one timestep gives the same velocity); a two-expert Wan2.2 pipeline
        (``transformer_2`` below ``boundary_ratio``) is family ``wan22-a14b``'s."""
        cls.check_experts(pipeline_index(source), source)
        return super()._load(source, weights=weights)

    @classmethod
    def check_experts(cls, index: dict[str, Any], source: PretrainedSource) -> None:
        """Refuse a pipeline whose ``model_index.json`` (``index``) pairs two experts."""
        if index.get("boundary_ratio") is not None:
            raise FlowpostError(
                f"a two-expert Wan2.2 pipeline (transformer_2 below boundary_ratio {index['boundary_ratio']}); wan2 "
                "trains one transformer: set model.family: wan22-a14b",
                where=f"{source.path}/model_index.json",
            )

    @staticmethod
    def scheduler_shift(config: Any) -> float:
        """UniPC's ``flow_shift`` or flow-match Euler's ``shift``."""
        return float(config.get("flow_shift", config.get("shift", 1.0)))

    def _check_video_size(self) -> None:
        spatial = self.vae_factors[1] * self.transformer.config.patch_size[1]
        multiple = max(spatial, 16)  # the stock pipeline also wants sides divisible by 16
        for name in ("height", "width"):
            if getattr(self, name) % multiple:
                raise FlowpostError(
                    f"{name} {getattr(self, name)} is not a multiple of {multiple}; round it",
                    where=f"model.options.{name}",
                )
        temporal = self.vae_factors[0]
        if self.num_frames < 1 or (self.num_frames - 1) % temporal:
            raise FlowpostError(
                f"num_frames {self.num_frames} is not {temporal} k + 1 frames; use e.g. {temporal * 20 + 1}",
                where="model.options.num_frames",
            )

    @cached_property
    def vae_factors(self) -> tuple[int, int]:
        """(temporal, spatial) pixels per latent cell, from the VAE's config (its weights are not loaded)."""
        from diffusers import AutoencoderKLWan

        config = self.source.config("vae", AutoencoderKLWan)
        return int(config.get("scale_factor_temporal", 4)), int(config.get("scale_factor_spatial", 8))

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        temporal, spatial = self.vae_factors
        frames = (self.num_frames - 1) // temporal + 1
        return (self.transformer.config.in_channels, frames, self.height // spatial, self.width // spatial)

    def inference_sigmas(self, steps: int) -> Tensor:
        """The scheduler's sigmas for ``steps`` (``set_timesteps(steps)``): the pipeline's ``flow_shift`` grid."""
        _, frames, height, width = self.latent_shape
        _, patch_h, patch_w = self.transformer.config.patch_size
        return self.scheduler_sigmas(steps, frames * (height // patch_h) * (width // patch_w))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "media": "video"}

    def shard_units(self) -> list[torch.nn.Module]:
        return list(self.transformer.blocks)

    def timestep(self, sigma: Tensor) -> Tensor:
        """The transformer's fp32 timestep at ``sigma``, as the stock pipeline's scheduler gives it:
        ``sigma * 1000``, truncated to a whole number under UniPC (whose ``timesteps`` are integers)."""
        if type(self.scheduler).__name__ == "UniPCMultistepScheduler":
            return (sigma.double() * 1000.0).floor().float()
        return sigma.float() * 1000.0

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep(sigma)``, as the stock pipeline calls it, in the latents' dtype."""
        assert isinstance(state, MaskedTextState)
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).expand(latents.shape[0])
        return self.transformer(
            hidden_states=latents,
            timestep=self.timestep(sigma),
            encoder_hidden_states=state.encoder_hidden_states.to(device=latents.device, dtype=latents.dtype),
            return_dict=False,
        )[0]

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """UMT5 token states, zero past each prompt's length up to ``max_length`` (as the stock pipeline pads
        them), 1 on each prompt's tokens in the mask (as the stock tokenizer call marks them); no pooled vector."""
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        embeds, _ = pipeline.encode_prompt(
            prompt=prompts, do_classifier_free_guidance=False, max_sequence_length=max_length, device=device
        )
        tokens = pipeline.tokenizer(
            [prompt_clean(p) for p in prompts],
            padding="max_length",
            max_length=max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = tokens.attention_mask.to(device=embeds.device, dtype=torch.int8)
        return ConditionBatch(embeds, mask, embeds.new_zeros(len(prompts), 0))

    def prepare_condition_state(self, batch: ConditionBatch) -> MaskedTextState:
        """Every cached position: the transformer reads the zero-padded states whole, as the stock pipeline."""
        return MaskedTextState(batch.token_states, batch.token_mask.bool())

    def prepare_vae(self, vae: torch.nn.Module) -> torch.nn.Module:
        """The pipeline's VAE, coding one video at a time (and in spatial tiles with ``vae_tiling``)."""
        vae.enable_slicing()
        if self.vae_tiling:
            vae.enable_tiling()
        return vae

    def _latent_statistics(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """The VAE's per-channel ``latents_mean`` and ``latents_std`` as ``[1, C, 1, 1, 1]`` on ``like``."""
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=like.device, dtype=like.dtype).view(shape)
        std = torch.tensor(config.latents_std, device=like.device, dtype=like.dtype).view(shape)
        return mean, std

    @property
    def pixel_shape(self) -> tuple[int, ...]:
        return (3, self.num_frames, self.height, self.width)

    def encode_output_state(self, media: Tensor) -> Tensor:
        """Videos ``[B, 3, T, H, W]`` in [0, 1] to latents: the posterior's mean, ``(z - mean) / std``."""
        vae = self.vae_on(media.device)
        pixels = (media * 2.0 - 1.0).to(next(vae.parameters()).dtype)
        latents = vae.encode(pixels).latent_dist.mode()
        mean, std = self._latent_statistics(latents)
        return ((latents - mean) / std).to(media.dtype)

    def decode(self, latents: Tensor) -> Tensor:
        """Latents to videos ``[B, 3, T, H, W]`` in [0, 1], as the stock pipeline decodes (fp32 result)."""
        vae = self.vae_on(latents.device)
        scaled = latents.to(next(vae.parameters()).dtype)
        mean, std = self._latent_statistics(scaled)
        pixels = vae.decode(scaled / (1.0 / std) + mean, return_dict=False)[0]
        return (pixels.float() / 2.0 + 0.5).clamp(0.0, 1.0)


def pipeline_index(source: PretrainedSource) -> dict[str, Any]:
    """The pipeline's ``model_index.json`` (its components and options: ``boundary_ratio``, ``expand_timesteps``)."""
    from diffusers import WanPipeline

    try:
        return dict(WanPipeline.load_config(source.path, revision=source.revision))
    except (OSError, ValueError) as error:
        raise FlowpostError(f"cannot read its model_index.json: {error}", where=source.path) from error
