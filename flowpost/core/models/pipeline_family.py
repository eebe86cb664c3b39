"""What the families loaded from a diffusers pipeline share (sd3, flux1): the source, the scheduler,
the manifest round trip, the VAE codec and the scheduler's inference sigmas."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import read_json
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import TextState
from flowpost.core.models.transformer_adapter import TransformerAdapter
from flowpost.core.sampling.schedules import flux_shift_mu
from flowpost.errors import FlowpostError


class PipelineFamily(TransformerAdapter):
    """A diffusers pipeline's transformer and scheduler; the VAE and the text encoders load from the
    source pipeline on first use (training from cached conditions never loads the text encoders).

    ``options`` name the constructor's keyword options the manifest records and ``from_pretrained``
    restores.
    """

    transformer_class: ClassVar[str]  # the diffusers class of the ``transformer`` component
    pipeline_class: ClassVar[str]  # the diffusers pipeline whose ``encode_prompt`` encodes conditions
    text_components: ClassVar[dict[str, str]]  # text encoder and tokenizer components -> transformers class
    options: ClassVar[tuple[str, ...]] = ()
    default_encoder_max_length: ClassVar[int]

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        encoder_max_length: int | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__(transformer)
        self.scheduler = scheduler
        self.source = source
        self.shift = float(scheduler.config.shift)
        self.encoder_max_length = encoder_max_length or self.default_encoder_max_length
        self.set_gradient_checkpointing(gradient_checkpointing)

    @classmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict | None = None) -> Self:
        raise FlowpostError(f"the {cls.family} family starts from pretrained weights: set it", where="model.pretrained")

    @classmethod
    def _load(cls, source: PretrainedSource) -> tuple[torch.nn.Module, Any]:
        import diffusers

        transformer = source.load("transformer", getattr(diffusers, cls.transformer_class))
        return transformer, source.load("scheduler", diffusers.FlowMatchEulerDiscreteScheduler, weights=False)

    @classmethod
    def from_pipeline(cls, source: PretrainedSource, **options: Any) -> Self:
        """The transformer and scheduler of a diffusers pipeline (folder or hub id)."""
        return cls(*cls._load(source), source, **options)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Self:
        """A folder ``save_pretrained`` wrote (its manifest names the source pipeline), or a pipeline folder."""
        if not (Path(path) / ADAPTER_FILE).is_file():
            return cls.from_pipeline(PretrainedSource(str(path)))
        meta = read_json(Path(path) / ADAPTER_FILE, what="model adapter manifest")
        source = PretrainedSource(**meta["pretrained"])
        own = PretrainedSource(str(path), torch_dtype=source.torch_dtype)
        options = {name: meta[name] for name in cls.options}
        return cls(*cls._load(own), source, encoder_max_length=int(meta["encoder_max_length"]), **options)

    def save_pretrained(self, path: str | Path) -> None:
        """The transformer (LoRA merged) and scheduler as diffusers folders; the manifest names the source pipeline."""
        super().save_pretrained(path)
        self.scheduler.save_pretrained(Path(path) / "scheduler")

    def describe(self) -> dict[str, Any]:
        description = super().describe()
        description["schedule"]["scheduler"] = type(self.scheduler).__name__
        options = {name: getattr(self, name) for name in self.options}
        return {**description, **options, "pretrained": self.source.to_dict()}

    def scheduler_sigmas(self, steps: int, image_seq_len: int, sigmas: np.ndarray | None = None) -> Tensor:
        """A fresh copy of the scheduler's sigmas after ``set_timesteps(steps, sigmas=...)``, with ``mu``
        from the image token count when it shifts dynamically (fp32, CPU)."""
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        config = scheduler.config
        options: dict[str, Any] = {} if sigmas is None else {"sigmas": sigmas}
        if config.get("use_dynamic_shifting"):
            options["mu"] = flux_shift_mu(
                image_seq_len,
                base_seq_len=config.base_image_seq_len,
                max_seq_len=config.max_image_seq_len,
                base_shift=config.base_shift,
                max_shift=config.max_shift,
            )
        scheduler.set_timesteps(None if sigmas is not None else steps, **options)
        return scheduler.sigmas.float().cpu()

    @cached_property
    def vae(self) -> torch.nn.Module:
        from diffusers import AutoencoderKL

        return self.source.load("vae", AutoencoderKL).eval().requires_grad_(False)

    def vae_encode(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to latents: the VAE posterior's mean, then ``(x - shift) * scale``."""
        vae = self.vae.to(media.device)
        pixels = (media * 2.0 - 1.0).to(next(vae.parameters()).dtype)
        latents = vae.encode(pixels).latent_dist.mode()
        return ((latents - vae.config.shift_factor) * vae.config.scaling_factor).to(media.dtype)

    def vae_decode(self, latents: Tensor) -> Tensor:
        """Latents to media in [0, 1], as the stock pipelines decode (fp32 result)."""
        vae = self.vae.to(latents.device)
        scaled = latents / vae.config.scaling_factor + vae.config.shift_factor
        pixels = vae.decode(scaled.to(next(vae.parameters()).dtype), return_dict=False)[0]
        return (pixels.float() / 2.0 + 0.5).clamp(0.0, 1.0)

    @cached_property
    def prompt_pipeline(self) -> Any:
        """The stock pipeline with its text encoders and tokenizers only (no transformer, no VAE)."""
        import diffusers
        import transformers

        parts = {
            name: self.source.load(name, getattr(transformers, loader), weights=not name.startswith("tokenizer"))
            for name, loader in self.text_components.items()
        }
        return getattr(diffusers, self.pipeline_class)(transformer=None, scheduler=self.scheduler, vae=None, **parts)

    @staticmethod
    def text_conditions(embeds: Tensor, pooled: Tensor) -> ConditionBatch:
        """Token states and pooled vectors as cached (fp32, CPU); the mask is all ones: the MMDiT
        transformers attend to every position, padding included."""
        mask = torch.ones(embeds.shape[:2], dtype=torch.int8)
        return ConditionBatch(embeds.float().cpu(), mask, pooled.float().cpu())

    def prepare_condition_state(self, batch: ConditionBatch) -> TextState:
        return TextState(batch.token_states, batch.pooled)
