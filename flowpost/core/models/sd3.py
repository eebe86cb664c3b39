"""The sd3 family (SD3 / SD3.5): a diffusers ``StableDiffusion3Pipeline`` folder or hub id."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import read_json
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.core.models.lora import without_lora
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.sd3_prompts import T5_MAX_LENGTH, SD3PromptEncoder
from flowpost.core.models.sd3_transformer import SD3State, SD3TransformerAdapter
from flowpost.errors import FlowpostError


class SD3Adapter(SD3TransformerAdapter):
    """``SD3Transformer2DModel`` on ``AutoencoderKL`` latents, conditioned by CLIP-L + CLIP-G + T5.

    The transformer and scheduler load with the adapter; the VAE and the text encoders load from the
    source pipeline on first use (training from cached conditions never loads the text encoders; the
    conditions node loads them alone through ``prompt_encoder``).
    """

    family: ClassVar[str] = "sd3"
    encoder_name = "sd3"
    output_codec: ClassVar[str] = "AutoencoderKL, (x - shift_factor) * scaling_factor"

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        encoder_max_length: int = T5_MAX_LENGTH,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__(transformer)
        self.scheduler = scheduler
        self.source = source
        self.shift = float(scheduler.config.shift)
        self.encoder_max_length = encoder_max_length
        self.set_gradient_checkpointing(gradient_checkpointing)

    @classmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict | None = None) -> SD3Adapter:
        raise FlowpostError("the sd3 family starts from pretrained weights: set it", where="model.pretrained")

    @classmethod
    def from_pipeline(cls, source: PretrainedSource) -> SD3Adapter:
        """The transformer and scheduler of a diffusers SD3 pipeline (folder or hub id)."""
        from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

        transformer = source.load("transformer", SD3Transformer2DModel)
        adapter = cls(transformer, source.load("scheduler", FlowMatchEulerDiscreteScheduler, weights=False), source)
        adapter.transformer_is_pipelines = True
        return adapter

    @classmethod
    def from_pretrained(cls, path: str | Path) -> SD3Adapter:
        """A folder ``save_pretrained`` wrote (its manifest names the source pipeline), or a pipeline folder."""
        from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

        if not (Path(path) / ADAPTER_FILE).is_file():
            return cls.from_pipeline(PretrainedSource(str(path)))
        meta = read_json(Path(path) / ADAPTER_FILE, what="model adapter manifest")
        source = PretrainedSource(**meta["pretrained"])
        own = PretrainedSource(str(path), torch_dtype=source.torch_dtype)
        return cls(
            own.load("transformer", SD3Transformer2DModel),
            own.load("scheduler", FlowMatchEulerDiscreteScheduler, weights=False),
            source,
            encoder_max_length=int(meta["encoder_max_length"]),
        )

    def save_pretrained(self, path: str | Path) -> None:
        """The transformer (LoRA merged) and scheduler as diffusers folders; the manifest names the source pipeline."""
        super().save_pretrained(path)
        self.scheduler.save_pretrained(Path(path) / "scheduler")

    def save_pipeline(self, path: str | Path) -> None:
        """The source pipeline with this transformer (LoRA merged) and scheduler, saved as one folder."""
        from diffusers import StableDiffusion3Pipeline

        network = without_lora(self.transformer)
        options = {"revision": self.source.revision, "variant": self.source.variant}
        if self.source.torch_dtype is not None:
            options["torch_dtype"] = getattr(torch, self.source.torch_dtype)
        try:
            pipeline = StableDiffusion3Pipeline.from_pretrained(
                self.source.path, transformer=network, scheduler=self.scheduler, **options
            )
        except (OSError, ValueError) as error:
            raise FlowpostError(
                f"cannot load the source pipeline to export: {error}", where=self.source.path
            ) from error
        pipeline.save_pretrained(path, safe_serialization=True)

    def describe(self) -> dict[str, Any]:
        description = super().describe()
        description["schedule"]["scheduler"] = type(self.scheduler).__name__
        return {**description, "pretrained": self.source.to_dict()}

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Recompute each transformer block's activations in backward instead of storing them."""
        if enabled:
            self.transformer.enable_gradient_checkpointing()
        else:
            self.transformer.disable_gradient_checkpointing()

    def inference_sigmas(self, steps: int) -> Tensor:
        """The scheduler's sigmas for ``steps`` (``set_timesteps(steps)``), as the stock pipeline integrates."""
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        options: dict[str, float] = {}
        if scheduler.config.get("use_dynamic_shifting"):
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

            _, height, width = self.latent_shape
            patch = self.transformer.config.patch_size
            options["mu"] = calculate_shift(
                (height // patch) * (width // patch),
                scheduler.config.get("base_image_seq_len", 256),
                scheduler.config.get("max_image_seq_len", 4096),
                scheduler.config.get("base_shift", 0.5),
                scheduler.config.get("max_shift", 1.16),
            )
        scheduler.set_timesteps(steps, **options)
        return scheduler.sigmas.float().cpu()

    @classmethod
    def prompt_encoder(cls, source: PretrainedSource, *, max_length: int) -> SD3PromptEncoder:
        return SD3PromptEncoder.for_conditions(source, max_length=max_length)

    @cached_property
    def text_encoders(self) -> SD3PromptEncoder:
        """The source pipeline's text encoders, loaded on the first ``encode_conditions``."""
        return SD3PromptEncoder(self.source, self.encoder_max_length)

    def encode_conditions(self, prompts: list[str], *, max_length: int | None = None) -> ConditionBatch:
        """As the stock pipeline's ``encode_prompt`` (``SD3PromptEncoder.encode``), at this model's T5 length."""
        return self.text_encoders.encode(
            prompts, max_length=self.encoder_max_length if max_length is None else max_length
        )

    def prepare_condition_state(self, batch: ConditionBatch) -> SD3State:
        return SD3State(batch.token_states, batch.pooled)

    @cached_property
    def vae(self) -> torch.nn.Module:
        from diffusers import AutoencoderKL

        return self.source.load("vae", AutoencoderKL).eval().requires_grad_(False)

    def encode_output_state(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to latents: the VAE posterior's mean, then ``(x - shift) * scale``."""
        vae = self.vae.to(media.device)
        pixels = (media * 2.0 - 1.0).to(next(vae.parameters()).dtype)
        latents = vae.encode(pixels).latent_dist.mode()
        return ((latents - vae.config.shift_factor) * vae.config.scaling_factor).to(media.dtype)

    def decode(self, latents: Tensor) -> Tensor:
        """Latents to media in [0, 1], as the stock pipeline decodes (fp32 result)."""
        vae = self.vae.to(latents.device)
        scaled = latents / vae.config.scaling_factor + vae.config.shift_factor
        pixels = vae.decode(scaled.to(next(vae.parameters()).dtype), return_dict=False)[0]
        return (pixels.float() / 2.0 + 0.5).clamp(0.0, 1.0)
