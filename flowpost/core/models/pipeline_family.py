"""What the families loaded from a diffusers pipeline share (sd3, flux1, flux2, qwen-image, wan2, z-image): the source,
the scheduler, the manifest round trip, the pipeline export, the VAE codec, the text encoders and the scheduler's
inference sigmas."""

from __future__ import annotations

import dataclasses
import re
from abc import abstractmethod
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Self

import numpy as np
import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import read_json, sha256_json
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.core.models.block_checkpointing import BlockCheckpointing
from flowpost.core.models.lora import without_lora
from flowpost.core.models.pipeline_prompts import PipelinePrompts
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.text_state import TextState
from flowpost.core.models.transformer_adapter import TransformerAdapter
from flowpost.core.sampling.schedules import flux_shift_mu
from flowpost.errors import FlowpostError

HALF_PRECISION = ("bfloat16", "float16")
# The first diffusers release with every class and call the families use (pyproject's floor): qwen-image's
# transformer takes its text length from the mask, without ``txt_seq_lens``, from 0.37 on.
DIFFUSERS_FLOOR = "0.37"


def _release(version: str) -> tuple[int, ...]:
    """``major.minor`` of a version string as integers (``0.37.0.dev0`` -> ``(0, 37)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


class PipelineFamily(TransformerAdapter):
    """A diffusers pipeline's transformer and scheduler; the VAE and the text encoders load from the
    source pipeline on first use (training from cached conditions never loads the text encoders; the
    conditions node loads them alone through ``prompt_encoder``).

    ``options`` name the constructor's keyword options the manifest records and ``from_pretrained``
    restores.
    """

    transformer_class: ClassVar[str]  # the diffusers class of the ``transformer`` component
    vae_class: ClassVar[str] = "AutoencoderKL"  # the diffusers class of the ``vae`` component
    pipeline_class: ClassVar[str]  # the diffusers pipeline: its ``encode_prompt`` encodes conditions, it exports
    text_models: ClassVar[tuple[tuple[str, str], ...]]  # see ``PromptFamily``
    scheduler_classes: ClassVar[tuple[str, ...]] = ("FlowMatchEulerDiscreteScheduler",)  # the ones it samples with
    default_encoder_max_length: ClassVar[int]

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        encoder_max_length: int | None = None,
        gradient_checkpointing: BlockCheckpointing = False,
    ) -> None:
        super().__init__(transformer)
        self.scheduler = scheduler
        self.source = source
        if source.torch_dtype in HALF_PRECISION:  # frozen weights in half precision: the network computes in it
            self.compute_dtype = getattr(torch, source.torch_dtype)
        self.shift = self.scheduler_shift(scheduler.config)
        self.encoder_max_length = encoder_max_length or self.default_encoder_max_length
        self.gradient_checkpointing = gradient_checkpointing
        self.set_gradient_checkpointing(gradient_checkpointing)

    @staticmethod
    def scheduler_shift(config: Any) -> float:
        """The constant sigma shift of training sigmas: flow-match Euler's ``shift``, or 1 when the scheduler
        shifts dynamically (diffusers then ignores ``shift``: sampling shifts by ``mu`` from the image token
        count, and the stock training table and training scripts use unshifted sigmas)."""
        return 1.0 if config.get("use_dynamic_shifting") else float(config.shift)

    @classmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict | None = None) -> Self:
        raise FlowpostError(f"the {cls.family} family starts from pretrained weights: set it", where="model.pretrained")

    @classmethod
    def diffusers_module(cls) -> ModuleType:
        """The installed diffusers, refused (naming this family and the release it needs) when it predates
        ``DIFFUSERS_FLOOR`` or lacks one of the family's classes."""
        import diffusers

        need = f"{cls.family} needs diffusers >= {DIFFUSERS_FLOOR}"
        if _release(diffusers.__version__) < _release(DIFFUSERS_FLOOR):
            raise FlowpostError(
                f"{need}, installed is {diffusers.__version__}; pip install -U 'diffusers>={DIFFUSERS_FLOOR}'",
                where="model.family",
            )
        missing = [name for name in (cls.transformer_class, cls.pipeline_class) if not hasattr(diffusers, name)]
        if missing:
            raise FlowpostError(
                f"the installed diffusers {diffusers.__version__} has no {', '.join(missing)}: {need}",
                where="model.family",
            )
        return diffusers

    @classmethod
    def _load(cls, source: PretrainedSource, *, weights: bool = True) -> tuple[torch.nn.Module, Any]:
        """The transformer (``weights=False``: on the meta device, from its config) and the scheduler."""
        diffusers = cls.diffusers_module()
        transformer = cls._transformer(source, getattr(diffusers, cls.transformer_class), weights=weights)
        return transformer, cls._scheduler(source)

    @classmethod
    def _scheduler(cls, source: PretrainedSource) -> Any:
        """The pipeline's scheduler, of the class its config names: one of ``scheduler_classes``, or refused
        (a scheduler of another kind is never sampled as another)."""
        diffusers = cls.diffusers_module()
        name = source.config("scheduler", diffusers.FlowMatchEulerDiscreteScheduler).get("_class_name")
        if name not in cls.scheduler_classes:
            raise FlowpostError(
                f"its scheduler is {name!r}; family {cls.family!r} samples on the sigmas of "
                f"{' or '.join(cls.scheduler_classes)}",
                where=f"{source.path}/scheduler",
            )
        return source.load("scheduler", getattr(diffusers, name), weights=False)

    @staticmethod
    def _transformer(source: PretrainedSource, loader: Any, *, weights: bool) -> torch.nn.Module:
        return source.load("transformer", loader) if weights else source.empty("transformer", loader)

    @classmethod
    def without_weights(cls, source: PretrainedSource, **options: Any) -> Self:
        """This family on a meta-device transformer built from the pipeline's configs alone: the shapes,
        parameter counts and latent size a stage would train, for sizing it; nothing runs on it."""
        return cls(*cls._load(source, weights=False), source, **options)

    @classmethod
    def from_pipeline(cls, source: PretrainedSource, **options: Any) -> Self:
        """The transformer and scheduler of a diffusers pipeline (folder or hub id)."""
        source.check_components()
        adapter = cls(*cls._load(source), source, **options)
        adapter.transformer_is_pipelines = True
        return adapter

    @classmethod
    def from_pretrained(cls, path: str | Path, *, base: str | None = None) -> Self:
        """A folder ``save_pretrained`` or ``export`` wrote, or a pipeline folder. The VAE, the text encoders and,
        when the folder has no ``scheduler/``, the scheduler come from ``base_source``."""
        if not (Path(path) / ADAPTER_FILE).is_file():
            return cls.from_pipeline(PretrainedSource(str(path)))
        meta = read_json(Path(path) / ADAPTER_FILE, what="model adapter manifest")
        source = cls.base_source(path, base)
        own = PretrainedSource(str(path), torch_dtype=source.torch_dtype)
        transformer = cls._transformer(own, getattr(cls.diffusers_module(), cls.transformer_class), weights=True)
        scheduler = cls._scheduler(own if (Path(path) / "scheduler").is_dir() else source)  # older exports: none
        options = {name: meta[name] for name in cls.options if name in meta}  # older manifests lack newer options
        return cls(transformer, scheduler, source, encoder_max_length=int(meta["encoder_max_length"]), **options)

    @staticmethod
    def base_source(path: str | Path, base: str | None = None) -> PretrainedSource:
        """The pipeline a saved folder samples with: the folder itself when it is a whole pipeline (a
        ``pipeline``-format export, with ``model_index.json``), else the one its manifest names, at ``base``
        when given (a moved folder)."""
        meta = read_json(Path(path) / ADAPTER_FILE, what="model adapter manifest")
        source = PretrainedSource(**meta["pretrained"])
        if base is None and (Path(path) / "model_index.json").is_file():
            return PretrainedSource(str(path), torch_dtype=source.torch_dtype)
        return source if base is None else dataclasses.replace(source, path=base)

    def save_pretrained(self, path: str | Path) -> None:
        """The transformer (LoRA merged) and scheduler as diffusers folders; the manifest names the source pipeline."""
        super().save_pretrained(path)
        self.scheduler.save_pretrained(Path(path) / "scheduler")

    def save_pipeline(self, path: str | Path) -> None:
        """The source pipeline with this transformer (LoRA merged), scheduler and the source's overriding
        components, saved as one folder."""
        import diffusers

        networks = self.pipeline_networks()
        options = {"revision": self.source.revision, "variant": self.source.variant}
        if self.source.torch_dtype is not None:
            options["torch_dtype"] = getattr(torch, self.source.torch_dtype)
        try:
            parts = {**self.pipeline_components(), **self.source.load_overrides(skip=(*networks, "scheduler"))}
            pipeline = getattr(diffusers, self.pipeline_class).from_pretrained(
                self.source.path, **networks, scheduler=self.scheduler, **parts, **options
            )
        except (OSError, ValueError) as error:
            raise FlowpostError(
                f"cannot load the source pipeline to export: {error}", where=self.source.path
            ) from error
        pipeline.save_pretrained(path, safe_serialization=True)

    def pipeline_networks(self) -> dict[str, torch.nn.Module]:
        """The pipeline components this model replaces in an export, by component name (LoRA merged)."""
        return {"transformer": without_lora(self.transformer)}

    def pipeline_components(self) -> dict[str, Any]:
        """Components of the source pipeline that flowpost loads for ``save_pipeline`` instead of diffusers
        (none here)."""
        return {}

    def describe(self) -> dict[str, Any]:
        description = super().describe()
        description["schedule"]["scheduler"] = type(self.scheduler).__name__
        config = self.scheduler.config
        if config.get("use_dynamic_shifting"):  # sampling's mu, from the image token count (see scheduler_sigmas)
            description["schedule"]["dynamic_shift"] = {
                "base_shift": config.base_shift,
                "max_shift": config.max_shift,
                "base_seq_len": config.base_image_seq_len,
                "max_seq_len": config.max_image_seq_len,
            }
        options = {name: getattr(self, name) for name in self.options}
        return {
            **description,
            **options,
            "transformer_class": self.transformer_class,
            "pretrained": self.source.to_dict(),
        }

    def scheduler_sigmas(self, steps: int, image_seq_len: int, sigmas: np.ndarray | None = None) -> Tensor:
        """A fresh copy of the scheduler's sigmas after ``set_timesteps(steps, sigmas=...)``, with ``mu``
        from the image token count when it shifts dynamically (fp32, CPU)."""
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        config = scheduler.config
        options: dict[str, Any] = {} if sigmas is None else {"sigmas": sigmas}
        if config.get("use_dynamic_shifting"):
            options["mu"] = self.dynamic_shift_mu(image_seq_len, steps)
        with np.errstate(invalid="ignore", divide="ignore"):  # a 1-step grid stretched to shift_terminal: refused below
            scheduler.set_timesteps(None if sigmas is not None else steps, **options)
        if not bool(torch.isfinite(scheduler.sigmas).all()):
            raise FlowpostError(
                f"the {self.family} scheduler's sigmas for {steps} step(s) are not finite "
                f"(shift_terminal {config.get('shift_terminal')}); use more steps (sampling.steps, evaluate.steps)",
                where="sampling.steps",
            )
        return scheduler.sigmas.float().cpu()

    def dynamic_shift_mu(self, image_seq_len: int, steps: int) -> float:
        """The ``mu`` a dynamically shifting scheduler samples with: FLUX's line through the scheduler config's
        ``base_shift`` and ``max_shift`` at its two token counts (the step count does not enter)."""
        config = self.scheduler.config
        return flux_shift_mu(
            image_seq_len,
            base_seq_len=config.base_image_seq_len,
            max_seq_len=config.max_image_seq_len,
            base_shift=config.base_shift,
            max_shift=config.max_shift,
        )

    @cached_property
    def vae(self) -> torch.nn.Module:
        """The source's VAE in fp32 whatever ``torch_dtype`` is, as the reference trainers keep it: rewards score
        what it decodes and training reads what it encodes."""
        import diffusers

        source = dataclasses.replace(self.source, torch_dtype="float32")
        return self.prepare_vae(source.load("vae", getattr(diffusers, self.vae_class)).eval().requires_grad_(False))

    def prepare_vae(self, vae: torch.nn.Module) -> torch.nn.Module:
        """``vae`` set up as this family runs it (a family that slices or tiles its VAE says so here)."""
        return vae

    @property
    def pixel_shape(self) -> tuple[int, ...]:
        """One sample's pixels as its VAE encodes them: ``[3, H, W]`` (a video VAE's: ``[3, T, H, W]``)."""
        return (3, self.resolution, self.resolution)

    def loaded_codec(self) -> torch.nn.Module | None:
        return self.__dict__.get("vae")  # what the ``vae`` property cached, without loading it

    def vae_on(self, device: torch.device) -> torch.nn.Module:
        """The VAE on ``device``, moved only when it is elsewhere (``Module.to`` walks every module, each step)."""
        vae = self.vae
        if next(vae.parameters()).device != device:
            vae.to(device)
        return vae

    def codec_fingerprint(self) -> str:
        """The family, its codec, the VAE's files, the dtype it runs in and the family's options (its
        resolution or frame count shape the latents; gradient checkpointing does not)."""
        options = {name: getattr(self, name) for name in self.options if name != "gradient_checkpointing"}
        return sha256_json(
            {
                "family": self.family,
                "codec": self.output_codec,
                "vae": self.source.component_fingerprint("vae"),
                "vae_dtype": "float32",
                "options": options,
            }
        )

    def vae_encode(self, media: Tensor) -> Tensor:
        """Media in [0, 1] to latents: the VAE posterior's mean, then ``(x - shift) * scale``."""
        vae = self.vae_on(media.device)
        pixels = (media * 2.0 - 1.0).to(next(vae.parameters()).dtype)
        latents = vae.encode(pixels).latent_dist.mode()
        return ((latents - vae.config.shift_factor) * vae.config.scaling_factor).to(media.dtype)

    def vae_decode(self, latents: Tensor) -> Tensor:
        """Latents to media in [0, 1], as the stock pipelines decode (fp32 result)."""
        vae = self.vae_on(latents.device)
        scaled = latents / vae.config.scaling_factor + vae.config.shift_factor
        pixels = vae.decode(scaled.to(next(vae.parameters()).dtype), return_dict=False)[0]
        return (pixels.float() / 2.0 + 0.5).clamp(0.0, 1.0)

    @classmethod
    def prompt_encoder(cls, source: PretrainedSource, *, max_length: int) -> PipelinePrompts:
        return PipelinePrompts.for_conditions(cls, source, max_length=max_length)

    @cached_property
    def text_encoders(self) -> PipelinePrompts:
        """The source pipeline's text encoders, loaded on the first ``encode_conditions``."""
        return PipelinePrompts(type(self), self.source, self.encoder_max_length)

    def encode_conditions(self, prompts: list[str], *, max_length: int | None = None) -> ConditionBatch:
        """As the stock pipeline's ``encode_prompt`` (``PipelinePrompts.encode``), at this model's T5 length."""
        return self.text_encoders.encode(
            prompts, max_length=self.encoder_max_length if max_length is None else max_length
        )

    @staticmethod
    @abstractmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """Token states, their mask and pooled vectors from the family's ``pipeline.encode_prompt``."""

    def prepare_condition_state(self, batch: ConditionBatch) -> TextState:
        return TextState(batch.token_states, batch.pooled)
